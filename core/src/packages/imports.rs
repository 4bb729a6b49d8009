//! Which distributions a Python program's imports name (PKG-4).
//!
//! The import name and the distribution that provides it differ often enough (`docx` is
//! python-docx, `sklearn` is scikit-learn) that guessing from the name installs the wrong thing,
//! or something hostile squatting on the import name. So an import is mapped only by a table: the
//! baked stack's own import names first ([`super::stack`]), then [`IMPORT_DISTRIBUTIONS`] for
//! well-known packages that are not baked. An import in neither is left alone: it is the
//! standard library, a module of the workspace, or something the model must request by name.

/// Well-known import names of distributions that are not baked, and the distribution each is.
/// The baked stack's names are not repeated here: its table is consulted first.
pub const IMPORT_DISTRIBUTIONS: &[(&str, &str)] = &[
    ("altair", "altair"),
    ("arrow", "arrow"),
    ("boto3", "boto3"),
    ("bokeh", "bokeh"),
    ("cv2", "opencv-python-headless"),
    ("docx2txt", "docx2txt"),
    ("duckdb", "duckdb"),
    ("faker", "Faker"),
    ("folium", "folium"),
    ("geopandas", "geopandas"),
    ("humanize", "humanize"),
    ("jinja2", "Jinja2"),
    ("markdown", "Markdown"),
    ("networkx", "networkx"),
    ("nltk", "nltk"),
    ("polars", "polars"),
    ("plotly", "plotly"),
    ("pyarrow", "pyarrow"),
    ("pydantic", "pydantic"),
    ("rich", "rich"),
    ("seaborn", "seaborn"),
    ("shapely", "shapely"),
    ("skimage", "scikit-image"),
    ("sklearn", "scikit-learn"),
    ("statsmodels", "statsmodels"),
    ("sympy", "sympy"),
    ("tqdm", "tqdm"),
    ("xlrd", "xlrd"),
];

/// The distribution [`IMPORT_DISTRIBUTIONS`] maps `module` to.
#[must_use]
pub fn known_distribution(module: &str) -> Option<&'static str> {
    IMPORT_DISTRIBUTIONS
        .iter()
        .find(|(import, _)| *import == module)
        .map(|(_, distribution)| *distribution)
}

fn is_identifier(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `code` imports any of `modules` (dotted names count by their top-level package): the
/// one reading of "a run that uses the stack" (`CORRAL_WORKER_PYTHON_PREIMPORT`), by which a worker
/// hands a run the jail that pre-imports it (decisions 0015, 0046) and the pool routes the run to a
/// worker whose jail does (decision 0058). Not valid UTF-8 is read lossily, as the interpreter
/// would refuse it anyway.
#[must_use]
pub fn uses_any(code: &[u8], modules: &[String]) -> bool {
    if modules.is_empty() {
        return false;
    }
    let imported = imported_modules(&String::from_utf8_lossy(code));
    modules.iter().any(|name| {
        let top = name.split('.').next().unwrap_or(name);
        imported.iter().any(|m| m == top)
    })
}

/// The top-level modules `source` imports absolutely (`import a.b as c, d`, `from a.b import c`),
/// sorted, without repeats. Statements are read per line, after any indentation (an import inside
/// a `try` or a function counts); relative imports and `__future__` are not modules to install.
/// A line inside a string may be read as an import: the cost is one table lookup, since only a
/// name the tables know leads anywhere.
#[must_use]
pub fn imported_modules(source: &str) -> Vec<String> {
    let mut modules = Vec::new();
    for line in source.lines() {
        for statement in line.split(';') {
            let statement = statement.trim();
            if let Some(rest) = statement.strip_prefix("import ") {
                for item in rest.split(',') {
                    let dotted = item.split_whitespace().next().unwrap_or("");
                    push_top(&mut modules, dotted);
                }
            } else if let Some(rest) = statement.strip_prefix("from ") {
                let mut words = rest.split_whitespace();
                if let (Some(dotted), Some("import")) = (words.next(), words.next()) {
                    push_top(&mut modules, dotted);
                }
            }
        }
    }
    modules.sort();
    modules.dedup();
    modules
}

fn push_top(modules: &mut Vec<String>, dotted: &str) {
    let top = dotted.split('.').next().unwrap_or("");
    if is_identifier(top) && top != "__future__" && !dotted.starts_with('.') {
        modules.push(top.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_uses_the_named_modules_when_it_imports_any_of_them_or_a_submodule() {
        let stack = vec!["numpy".to_owned(), "matplotlib.pyplot".to_owned()];
        assert!(uses_any(b"import matplotlib\nprint(1)", &stack));
        assert!(uses_any(b"x = 1; from numpy.linalg import norm", &stack));
        assert!(!uses_any(
            b"import numpyx, json\nprint('import numpy')",
            &stack
        ));
        assert!(!uses_any(b"import numpy", &[]));
    }

    #[test]
    fn pkg_04_imports_are_read_from_the_code() {
        let code = "import pandas as pd, numpy\nfrom docx import Document\n\
                    from . import sibling\nfrom __future__ import annotations\n\
                    try:\n    import sklearn.linear_model\nexcept ImportError: pass\n\
                    x = 1; import yaml\nimportant = 2\nfrom_ = 3\n";
        assert_eq!(
            imported_modules(code),
            ["docx", "numpy", "pandas", "sklearn", "yaml"]
        );
    }

    #[test]
    fn pkg_04_import_names_map_to_distributions_by_table_only() {
        assert_eq!(known_distribution("sklearn"), Some("scikit-learn"));
        assert_eq!(known_distribution("cv2"), Some("opencv-python-headless"));
        assert_eq!(known_distribution("my_helpers"), None);
        // One entry per import name.
        let mut names: Vec<&str> = IMPORT_DISTRIBUTIONS.iter().map(|(i, _)| *i).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
    }
}
