//! What a jail runs: the interpreter's command line, cold or behind a bootstrap; the environment.

use corral_core::jail::Language;

use crate::relay;
use corral_stages::plan::LINE_WAITING;

/// Where the jail's interpreter writes a run's rich results (`corral_core::run::results`).
pub(super) fn results_path() -> String {
    format!("/tmp/{}", corral_core::run::results::FILE)
}

/// The display code's limits, as the Python tuple `_corral_results` takes: one definition, the
/// core's.
pub(super) fn results_limits() -> String {
    use corral_core::run::results::{HTML_MAX_BYTES, PNG_MAX_BYTES, RESULTS_MAX, TEXT_MAX_CHARS};
    format!("({RESULTS_MAX}, {TEXT_MAX_CHARS}, {HTML_MAX_BYTES}, {PNG_MAX_BYTES})")
}

/// The Python that writes a run's rich results (`_corral_results`), shared by the runner and a
/// persistent cell's driver.
pub(super) const DISPLAY_SOURCE: &str = include_str!("display.py");

/// The Python runner: the code from stdin (a prepared jail's bootstrap, after the waiting line)
/// or from `path` (a cold run), run as the main program under `path`'s name; the value of its
/// last expression and the figures it left open written as rich results to `results`, if given.
fn python_runner(
    python: &str,
    path: &str,
    preimport: &[String],
    from_stdin: bool,
    results: Option<&str>,
) -> Vec<String> {
    // Imported while no tenant's file exists (the workspace is filled when a run takes
    // the jail), so no workspace module can stand in for one of these; the import
    // system's directory caches are dropped once the code has arrived, so that the
    // tenant's modules are found.
    let preimport_source = preimport_source(preimport);
    let invalidate = if preimport.is_empty() {
        ""
    } else {
        "\x20   __import__('importlib').invalidate_caches()\n"
    };
    // Where the code comes from: the supervisor's pipe, once the waiting line is out, with
    // /dev/null put in its place so the code reads end of input as a cold run does; or the
    // code's file.
    let read = code_source(path, from_stdin, invalidate);
    // Rich results (corral_core::run::results): the last statement, when it is an expression,
    // is evaluated apart so that its value can be shown, as a notebook cell's is. The syntax tree
    // comes from the builtin `_ast` (imported while a jail is prepared; `ast` would cost a cold
    // run 5 ms of imports).
    let (display, show) = match results {
        Some(results) => (
            DISPLAY_SOURCE.to_owned(),
            format!(
                "\x20       show(value, last is not None, {results:?}, {})\n",
                results_limits()
            ),
        ),
        None => ("_corral_results = None\n".to_owned(), String::new()),
    };
    let run_function = run_source(&show);
    // The bootstrap's own names are removed from __main__ before the code runs in it; what
    // runs after the code holds its own references (closure cells), not globals the code
    // could rebind.
    let source = format!(
        "import sys, os, _ast as ast, __main__ as m\n\
         {preimport_source}\
         {display}\
         def _corral(sys=sys, os=os, ast=ast, m=m, show=_corral_results):\n\
         \x20   import gc, atexit\n\
         {read}\
         \x20   sys.argv = [{path:?}]\n\
         \x20   sys.path[0] = {dir:?}\n\
         \x20   g = m.__dict__\n\
         \x20   for k in [k for k in g if k not in ('__name__', '__doc__', '__builtins__', '__spec__', '__loader__', '__package__')]:\n\
         \x20       del g[k]\n\
         \x20   g['__file__'] = {path:?}\n\
         \x20   tree = compile(src, {path:?}, 'exec', ast.PyCF_ONLY_AST)\n\
         \x20   last = tree.body.pop() if tree.body and type(tree.body[-1]) is ast.Expr else None\n\
         \x20   code = compile(tree, {path:?}, 'exec')\n\
         \x20   last = compile(ast.Expression(last.value), {path:?}, 'eval') if last is not None else None\n\
         \x20   del tree\n\
         \x20   gc.freeze()\n\
         {run_function}\
         \x20   return run\n\
         _corral()()\n",
        dir = JAIL_CODE_DIR,
    );
    vec![python.to_owned(), "-c".to_owned(), source]
}

/// The Python that imports `preimport`, each in its own `try`, before any tenant file exists.
fn preimport_source(preimport: &[String]) -> String {
    if preimport.is_empty() {
        String::new()
    } else {
        let names: Vec<String> = preimport.iter().map(|name| format!("{name:?}")).collect();
        format!(
            "def _corral_preimport(names):\n\
             \x20   import importlib\n\
             \x20   for name in names:\n\
             \x20       try:\n\
             \x20           importlib.import_module(name)\n\
             \x20       except Exception:\n\
             \x20           pass\n\
             _corral_preimport([{}])\n",
            names.join(", ")
        )
    }
}

/// The runner's lines that read the code into `src`: from stdin, once the waiting line is out,
/// or from the file at `path`.
fn code_source(path: &str, from_stdin: bool, invalidate: &str) -> String {
    if from_stdin {
        format!(
            "\x20   sys.stdout.flush()\n\
             \x20   os.write(1, b'{LINE_WAITING}\\n')\n\
             \x20   src = sys.stdin.buffer.read()\n\
             {invalidate}\
             \x20   fd = os.open('/dev/null', os.O_RDONLY)\n\
             \x20   os.dup2(fd, 0)\n\
             \x20   os.close(fd)\n"
        )
    } else {
        format!("\x20   with open({path:?}, 'rb') as f:\n\x20       src = f.read()\n")
    }
}

/// The runner's `run`: the code run as the main program, its last expression's value shown
/// (`show`), then the interpreter's own end without its teardown.
fn run_source(show: &str) -> String {
    // The end of the run (decision 0015): what the interpreter's own exit does before it
    // tears its modules down (join non-daemon threads, atexit handlers, the run's globals
    // dropped so that their files are flushed and closed, a collection, the standard
    // streams flushed), then `os._exit`. Tearing down the pre-imported stack would cost
    // every run a quarter of a second; the jail is discarded after the run regardless.
    // The pre-imported objects are frozen out of the collector, so the collection sees
    // only the run's. An uncaught exception prints as it would in a cold run, without the
    // bootstrap's frame.
    format!(
        "\x20   def run():\n\
         \x20       status = 0\n\
         \x20       value = None\n\
         \x20       try:\n\
         \x20           exec(code, g)\n\
         \x20           if last is not None:\n\
         \x20               value = eval(last, g)\n\
         \x20       except SystemExit as e:\n\
         \x20           c = e.code\n\
         \x20           if c is None:\n\
         \x20               status = 0\n\
         \x20           elif isinstance(c, int):\n\
         \x20               status = c\n\
         \x20           else:\n\
         \x20               try:\n\
         \x20                   print(c, file=sys.stderr)\n\
         \x20               except Exception:\n\
         \x20                   pass\n\
         \x20               status = 1\n\
         \x20       except BaseException as e:\n\
         \x20           tb = e.__traceback__\n\
         \x20           if tb is not None:\n\
         \x20               e.__traceback__ = tb = tb.tb_next\n\
         \x20           sys.excepthook(type(e), e, tb)\n\
         \x20           status = 1\n\
         {show}\
         \x20       value = None\n\
         \x20       try:\n\
         \x20           if 'threading' in sys.modules:\n\
         \x20               sys.modules['threading']._shutdown()\n\
         \x20           atexit._run_exitfuncs()\n\
         \x20           g.clear()\n\
         \x20           gc.collect()\n\
         \x20       except BaseException:\n\
         \x20           pass\n\
         \x20       for stream in (sys.stdout, sys.stderr):\n\
         \x20           try:\n\
         \x20               stream.flush()\n\
         \x20           except Exception:\n\
         \x20               status = status or 120\n\
         \x20       os._exit(status & 0xff)\n"
    )
}

/// Where the jail sees the code's directory (the run's code files, read-only).
const JAIL_CODE_DIR: &str = "/run/corral";

/// The path, inside the jail, of the program a run of `language` runs.
pub(super) fn code_path(language: Language) -> String {
    format!("{JAIL_CODE_DIR}/main.{}", language.extension())
}

/// The interpreter's command line for the code at `path` (inside the jail); `python` is the
/// Python interpreter (the baked stack's, or the system's).
pub(super) fn interpreter(
    language: Language,
    python: &str,
    path: &str,
    results: Option<&str>,
) -> Vec<String> {
    match language {
        // The runner a prepared jail has, reading the code's file: the same main program, the
        // same end, the same rich results.
        Language::Python => python_runner(python, path, &[], false, results),
        Language::Node => vec!["/usr/bin/node".to_owned(), path.to_owned()],
    }
}

/// The interpreter's command line in a prepared jail: a bootstrap that blocks reading the code
/// from stdin (the supervisor's pipe) until the supervisor closes it, puts /dev/null in its place
/// so the code reads end of input as a cold run does, and runs the code as the main program
/// under `path`'s name. It is visible to the code (pid 1's children are), and holds nothing secret.
///
/// Python's first imports `preimport` (`CORRAL_WORKER_PYTHON_PREIMPORT`, names corral-core has
/// checked to be dotted identifiers), each in its own `try`: a module that is missing or fails
/// is skipped, and the code meets it as a cold run would. The modules stay in `sys.modules`,
/// which is the point; their names, like the bootstrap's own, are removed from `__main__`.
pub(super) fn bootstrap(
    language: Language,
    python: &str,
    path: &str,
    preimport: &[String],
    results: Option<&str>,
) -> Vec<String> {
    match language {
        Language::Python => python_runner(python, path, preimport, true, results),
        Language::Node => {
            let source = format!(
                "(() => {{ const fs = require('fs'), M = require('module'); \
                 fs.writeSync(1, '{LINE_WAITING}\\n'); const src = fs.readFileSync(0, 'utf8'); fs.closeSync(0); fs.openSync('/dev/null', 'r'); \
                 const f = {path:?}; const m = new M('.', null); m.filename = f; \
                 m.paths = M._nodeModulePaths('/run/corral'); process.argv[1] = f; \
                 process.mainModule = m; m._compile(src, f); }})()"
            );
            vec!["/usr/bin/node".to_owned(), "-e".to_owned(), source]
        }
    }
}

/// Where, inside the jail, the packages a run installs live (decision 0014): the run's scratch
/// space, ahead of the stack on the code's path.
pub(super) const PYTHON_PREFIX: &str = "/tmp/.corral/python";
/// The site directory under [`PYTHON_PREFIX`] (the stack's interpreter is CPython 3.11).
const PYTHON_SITE: &str = "/tmp/.corral/python/lib/python3.11/site-packages";

/// The code's whole environment: nothing of the supervisor's. Its numerical libraries start as
/// many threads as the run is told it has CPUs, `cpus` (`corral_core::bounds::run_cpus`,
/// `library_environment`).
pub(super) fn environment(cpus: u32) -> Vec<(String, String)> {
    [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("TMPDIR", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("USER", "corral"),
        ("TERM", "dumb"),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("MPLCONFIGDIR", "/tmp/matplotlib"),
        ("NODE_PATH", "/workspace/node_modules"),
        // The egress relay (EGR-8); no NO_PROXY, so that nothing is meant to go around it.
        ("HTTP_PROXY", relay::PROXY_URL),
        ("HTTPS_PROXY", relay::PROXY_URL),
        ("http_proxy", relay::PROXY_URL),
        ("https_proxy", relay::PROXY_URL),
        ("ALL_PROXY", relay::PROXY_URL),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    // Modules written to the workspace are importable, as they would be beside the script;
    // packages the run installed come next, ahead of the baked stack (PKG-2).
    .chain([("PYTHONPATH".to_owned(), format!("/workspace:{PYTHON_SITE}"))])
    .chain(corral_core::bounds::library_environment(cpus))
    .collect()
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::Path;
    use std::process::{Command, Stdio};

    use super::*;

    /// Runs a bootstrap outside any jail (it needs none): the code arrives on stdin, and the code
    /// itself then reads end of input and sees itself as the main program at `path`.
    fn bootstrapped(language: Language, code: &str, preimport: &[String]) -> (i32, String, String) {
        let path = format!("/run/corral/main.{}", language.extension());
        let argv = bootstrap(language, "/usr/bin/python3", &path, preimport, None);
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(code.as_bytes()).unwrap();
        drop(stdin);
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        // The bootstrap says it waits before it reads the code.
        let Some(stdout) = stdout.strip_prefix(&format!("{LINE_WAITING}\n")) else {
            panic!("no waiting line: {stdout:?}");
        };
        (
            output.status.code().unwrap_or(-1),
            stdout.to_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Whether `interpreter` is installed; without it the test skips through
    /// `corral_testkit::skip` (which fails it under `CORRAL_REQUIRE_TOOLS`) and must return.
    fn interpreter_or_skip(test: &str, interpreter: &str) -> bool {
        if Path::new(interpreter).exists() {
            return true;
        }
        corral_testkit::skip(
            test,
            corral_testkit::Need::Tools,
            &format!("no {interpreter}"),
        );
        false
    }

    #[test]
    fn the_python_bootstrap_runs_the_code_as_main_with_stdin_at_its_end() {
        if !interpreter_or_skip(
            "the_python_bootstrap_runs_the_code_as_main_with_stdin_at_its_end",
            "/usr/bin/python3",
        ) {
            return;
        }
        let (code, stdout, stderr) = bootstrapped(
            Language::Python,
            "import sys\nprint(__name__, __file__, sys.argv, repr(sys.stdin.read()))\nprint(sorted(k for k in globals() if not k.startswith('__')))\nsys.exit(3)\n",
            &[],
        );
        assert_eq!(code, 3, "{stderr}");
        assert_eq!(
            stdout, "__main__ /run/corral/main.py ['/run/corral/main.py'] ''\n['sys']\n",
            "{stderr}"
        );
    }

    #[test]
    fn the_python_bootstrap_ends_a_run_as_the_interpreter_would() {
        if !interpreter_or_skip(
            "the_python_bootstrap_ends_a_run_as_the_interpreter_would",
            "/usr/bin/python3",
        ) {
            return;
        }
        // An uncaught exception: the traceback without the bootstrap's frame, and 1.
        let (code, _, stderr) =
            bootstrapped(Language::Python, "x = 1\n1 / 0\n", &["json".to_owned()]);
        assert_eq!(code, 1);
        assert!(
            stderr.starts_with(
                "Traceback (most recent call last):\n  File \"/run/corral/main.py\", line 2"
            ),
            "{stderr}"
        );
        assert!(
            stderr.ends_with("ZeroDivisionError: division by zero\n"),
            "{stderr}"
        );
        assert!(!stderr.contains("<string>"), "{stderr}");
        // sys.exit with a message: the message on stderr, and 1; with a number, that number.
        let (code, _, stderr) =
            bootstrapped(Language::Python, "import sys\nsys.exit('bye')\n", &[]);
        assert_eq!((code, stderr.as_str()), (1, "bye\n"));
        let (code, _, _) = bootstrapped(Language::Python, "raise SystemExit(300)\n", &[]);
        assert_eq!(code, 300 & 0xff);
        // What an exit does before tearing down: atexit handlers, a non-daemon thread joined,
        // an unclosed file of the run's flushed, stdout flushed.
        let dir = std::env::temp_dir().join(format!("corral-bootstrap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("unclosed.txt");
        let program = format!(
            "import atexit, threading, time, sys\n\
             atexit.register(lambda: print('atexit ran'))\n\
             def late():\n    time.sleep(0.2)\n    print('thread done')\n\
             threading.Thread(target=late).start()\n\
             f = open({file:?}, 'w')\nf.write('kept')\n\
             sys.stdout.write('no newline')\n",
            file = file.to_string_lossy()
        );
        let (code, stdout, stderr) = bootstrapped(Language::Python, &program, &[]);
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(stdout, "no newlinethread done\natexit ran\n");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_python_runner_shows_the_last_expression_warm_and_cold_as_a_rich_result() {
        let test = "the_python_runner_shows_the_last_expression_warm_and_cold_as_a_rich_result";
        if !interpreter_or_skip(test, "/usr/bin/python3") {
            return;
        }
        let dir = std::env::temp_dir().join(format!("corral-results-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let results = dir.join("results.jsonl");
        let results_text = results.to_string_lossy().into_owned();
        // Warm: the bootstrap, the code on stdin.
        let code = "class T:\n    def _repr_html_(self):\n        return '<b>t</b>'\n    def __repr__(self):\n        return 'T()'\nprint('out')\nT()\n";
        let argv = bootstrap(
            Language::Python,
            "/usr/bin/python3",
            "/run/corral/main.py",
            &[],
            Some(&results_text),
        );
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(code.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success());
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("{LINE_WAITING}\nout\n")
        );
        let (shown, notes) =
            corral_core::run::results::accept(&std::fs::read_to_string(&results).unwrap());
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(shown.len(), 1);
        assert_eq!(shown[0].text_plain.as_deref(), Some("T()"));
        assert_eq!(shown[0].text_html.as_deref(), Some("<b>t</b>"));
        std::fs::remove_file(&results).unwrap();
        // Cold: the same runner reading the code's file; a failing last expression shows nothing
        // and fails as a script would.
        let file = dir.join("main.py");
        for (program, status, expected) in [
            ("x = 6\nx * 7\n", 0, Some("42")),
            ("x = 6\nprint(x)\n", 0, None),
            ("x = 6\n", 0, None),
            ("1 / 0\n", 1, None),
        ] {
            std::fs::write(&file, program).unwrap();
            let argv = interpreter(
                Language::Python,
                "/usr/bin/python3",
                &file.to_string_lossy(),
                Some(&results_text),
            );
            let output = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
            assert_eq!(output.status.code(), Some(status), "{program}");
            let shown = std::fs::read_to_string(&results).ok();
            let plain = shown.as_deref().map(|text| {
                corral_core::run::results::accept(text).0[0]
                    .text_plain
                    .clone()
                    .unwrap()
            });
            assert_eq!(plain.as_deref(), expected, "{program}");
            let _ = std::fs::remove_file(&results);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_node_bootstrap_runs_the_code_as_main_with_stdin_at_its_end() {
        if !interpreter_or_skip(
            "the_node_bootstrap_runs_the_code_as_main_with_stdin_at_its_end",
            "/usr/bin/node",
        ) {
            return;
        }
        let (code, stdout, stderr) = bootstrapped(
            Language::Node,
            "const fs = require('fs');\nconsole.log(__filename, require.main === module, process.argv[1], JSON.stringify(fs.readFileSync(0, 'utf8')));\nprocess.exit(4);\n",
            &[],
        );
        assert_eq!(code, 4, "{stderr}");
        assert_eq!(
            stdout, "/run/corral/main.js true /run/corral/main.js \"\"\n",
            "{stderr}"
        );
    }

    #[test]
    fn the_python_bootstrap_preimports_and_skips_what_is_missing() {
        if !interpreter_or_skip(
            "the_python_bootstrap_preimports_and_skips_what_is_missing",
            "/usr/bin/python3",
        ) {
            return;
        }
        let preimport = ["json", "no_such_module_xyz", "xml.dom"].map(str::to_owned);
        let code = "import sys\nprint('json' in sys.modules, 'xml.dom' in sys.modules, 'no_such_module_xyz' in sys.modules)\nprint(sorted(k for k in globals() if k not in ('__name__', '__doc__', '__builtins__', '__spec__', '__loader__', '__package__', '__file__')))\n";
        let (exit, stdout, stderr) = bootstrapped(Language::Python, code, &preimport);
        assert_eq!(exit, 0, "{stderr}");
        assert_eq!(stdout, "True True False\n['sys']\n", "{stderr}");
        // Without the list, nothing is imported: the check above can fail.
        let (exit, stdout, stderr) = bootstrapped(Language::Python, code, &[]);
        assert_eq!(exit, 0, "{stderr}");
        assert_eq!(stdout, "False False False\n['sys']\n", "{stderr}");
    }
}
