//! `corral run FILE [OPTIONS]` (the flags are [`corral::cli::RunArgs`]): one `run_code` through
//! the API, printed for a person (or as the API's JSON). Exits 0 when the code
//! ran and succeeded, 1 when it ran and failed (or hit a bound), 3 when it was refused or not run,
//! 2 for unusable arguments.
//!
//! The API is `CORRAL_API_URL` (default `http://127.0.0.1:8000`); the credential is
//! `CORRAL_API_TOKEN`, else the file `CORRAL_API_TOKEN_FILE`, else `.corral/api-token` as
//! `corral up` writes it.

use std::path::Path;
use std::process::ExitCode;

use corral::cli::RunArgs;
use corral_api::client::{Client, render};

fn language_of(file: &Path) -> Option<&'static str> {
    match file.extension()?.to_str()? {
        "py" => Some("python"),
        "js" | "mjs" | "cjs" => Some("node"),
        _ => None,
    }
}

pub(crate) fn credential() -> Result<String, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(token) = corral_contract::credential::from_env(env, "CORRAL_API_TOKEN")? {
        return Ok(token);
    }
    std::fs::read_to_string(".corral/api-token")
        .map(|t| t.trim().to_owned())
        .map_err(|_| {
            String::from("no credential: set CORRAL_API_TOKEN or CORRAL_API_TOKEN_FILE, or run from the directory `corral up` was started in")
        })
}

/// The API's URL: `CORRAL_API_URL`, default `http://127.0.0.1:8000`.
pub(crate) fn api_url() -> String {
    std::env::var("CORRAL_API_URL").unwrap_or_else(|_| String::from("http://127.0.0.1:8000"))
}

/// `corral run`.
pub fn run(args: RunArgs) -> ExitCode {
    let file = args.file.display().to_string();
    let code = match std::fs::read_to_string(&args.file) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("corral run: {file}: {error}");
            return ExitCode::from(2);
        }
    };
    let Some(language) = args
        .language
        .clone()
        .or_else(|| language_of(&args.file).map(str::to_owned))
    else {
        eprintln!("corral run: cannot tell the language of {file}: pass --language python|node");
        return ExitCode::from(2);
    };
    let token = match credential() {
        Ok(token) => token,
        Err(error) => {
            eprintln!("corral run: {error}");
            return ExitCode::from(2);
        }
    };
    let base = api_url();
    let request = serde_json::json!({
        "actor": args.actor,
        "conversation": args.conversation,
        "member": args.member.unwrap_or_else(|| args.actor.clone()),
        "language": language,
        "code": code,
    });
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        return ExitCode::from(1);
    };
    let answer = runtime.block_on(async {
        let client = Client::new(&base, &token)?;
        client.run_code(&request).await
    });
    let (status, body) = match answer {
        Ok(answer) => answer,
        Err(error) => {
            eprintln!("corral run: {error} (is `corral up` running?)");
            return ExitCode::from(3);
        }
    };
    if args.json {
        println!("{body}");
    } else {
        print!("{}", render(status, &body));
    }
    match body["outcome"].as_str() {
        Some("succeeded") => ExitCode::SUCCESS,
        Some("failed" | "bound_exceeded") => ExitCode::from(1),
        _ => ExitCode::from(3),
    }
}
