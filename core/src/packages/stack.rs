//! The baked Python stack (PKG-1): the table generated from its hash-pinned lock
//! (`stack/python/table.tsv`), which resolution consults before the broker.
//!
//! The table ships inside this crate, so the API and the worker consult the same one; the stack's
//! build (`scripts/build-python-stack`) writes the same table into the installed environment and
//! fails when it differs from the checked-in one, and the worker refuses to call an environment
//! whose table differs from this one baked.

use std::sync::OnceLock;

use super::requirement::normalize;

/// The table as checked in: `distribution<TAB>version<TAB>import,names`, `#` comments.
pub const TABLE: &str = include_str!("../../../stack/python/table.tsv");

/// One baked distribution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Baked {
    /// The normalized distribution name.
    pub name: String,
    /// The exact version installed.
    pub version: String,
    /// The top-level import names it provides.
    pub imports: Vec<String>,
}

/// The baked stack: every distribution, sorted by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BakedStack {
    /// The distributions, sorted by name.
    pub distributions: Vec<Baked>,
}

impl BakedStack {
    /// Parses a table. A line that is not three tab-separated fields, a repeated distribution or
    /// a repeated import name is an error naming the line: the table is built, not typed, so a bad
    /// one is a build defect, never something to guess around.
    ///
    /// # Errors
    /// The first bad line, by number.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut distributions: Vec<Baked> = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split('\t').collect();
            let [name, version, imports] = fields.as_slice() else {
                return Err(format!(
                    "line {}: expected three tab-separated fields",
                    number + 1
                ));
            };
            if name.is_empty() || version.is_empty() {
                return Err(format!("line {}: an empty name or version", number + 1));
            }
            distributions.push(Baked {
                name: normalize(name),
                version: (*version).to_owned(),
                imports: imports
                    .split(',')
                    .map(str::trim)
                    .filter(|i| !i.is_empty())
                    .map(str::to_owned)
                    .collect(),
            });
        }
        distributions.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(pair) = distributions.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(format!("{} is listed twice", pair[0].name));
        }
        let mut imports: Vec<&str> = distributions
            .iter()
            .flat_map(|d| d.imports.iter().map(String::as_str))
            .collect();
        imports.sort_unstable();
        if let Some(pair) = imports.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("the import name {} is provided twice", pair[0]));
        }
        Ok(Self { distributions })
    }

    /// The baked distribution named `name` (any spelling PEP 503 normalizes to it).
    #[must_use]
    pub fn distribution(&self, name: &str) -> Option<&Baked> {
        let name = normalize(name);
        self.distributions
            .binary_search_by(|d| d.name.as_str().cmp(&name))
            .ok()
            .and_then(|i| self.distributions.get(i))
    }

    /// The baked distribution that provides the top-level module `module`.
    #[must_use]
    pub fn providing(&self, module: &str) -> Option<&Baked> {
        self.distributions
            .iter()
            .find(|d| d.imports.iter().any(|i| i == module))
    }

    /// `name version` of every distribution, for an error that names the stack.
    #[must_use]
    pub fn summary(&self) -> String {
        self.distributions
            .iter()
            .map(|d| format!("{} {}", d.name, d.version))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The stack this release was built with ([`TABLE`]).
///
/// # Panics
/// When the checked-in table does not parse (a build defect that its own test catches).
#[must_use]
pub fn baked() -> &'static BakedStack {
    static STACK: OnceLock<BakedStack> = OnceLock::new();
    STACK.get_or_init(|| BakedStack::parse(TABLE).expect("stack/python/table.tsv parses"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_01_the_checked_in_table_names_every_promised_distribution() {
        let stack = BakedStack::parse(TABLE).expect("the table parses");
        for promised in [
            "pandas",
            "numpy",
            "scipy",
            "matplotlib",
            "openpyxl",
            "xlsxwriter",
            "python-docx",
            "python-pptx",
            "pypdf",
            "pillow",
            "reportlab",
            "requests",
            "beautifulsoup4",
            "lxml",
            "tabulate",
            "pyyaml",
        ] {
            assert!(
                stack.distribution(promised).is_some(),
                "{promised} is not baked"
            );
        }
        for module in ["docx", "pptx", "yaml", "bs4", "PIL", "pandas", "numpy"] {
            assert!(
                stack.providing(module).is_some(),
                "nothing baked provides {module}"
            );
        }
        for not_baked in ["humanize", "folium"] {
            assert!(
                stack.distribution(not_baked).is_none(),
                "{not_baked} must not be baked"
            );
        }
        assert_eq!(
            stack.providing("docx").map(|d| d.name.as_str()),
            Some("python-docx")
        );
    }

    #[test]
    fn pkg_01_a_malformed_table_is_refused_by_line() {
        assert!(BakedStack::parse("a\t1\n").unwrap_err().contains("line 1"));
        assert!(
            BakedStack::parse("a\t1\tx\nA\t2\ty\n")
                .unwrap_err()
                .contains("twice")
        );
        assert!(
            BakedStack::parse("a\t1\tx\nb\t2\tx\n")
                .unwrap_err()
                .contains("import name x")
        );
        let ok = BakedStack::parse("# header\nPy_Yaml\t6.0\tyaml\n").unwrap();
        assert_eq!(
            ok.distribution("py.yaml").map(|d| d.version.as_str()),
            Some("6.0")
        );
    }
}
