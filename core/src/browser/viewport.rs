//! The viewport guard (BROW-8): which paths under `/api/browser-sessions/{id}/viewport/` reach
//! the worker's media adapter.
//!
//! Only the adapter's static client (and its signaling socket) is served there. Every path in the
//! adapter's own `api/` namespace is refused, judged on the path the adapter would route, not on
//! the spelling that arrived: the path is percent-decoded until decoding changes nothing (so
//! double encoding is seen through), a backslash counts as a separator, empty and `.` segments
//! are dropped and `..` removes the segment before it (never climbing above the viewport's root),
//! and a segment's `;parameters` and letter case are ignored when it is compared with `api`. What
//! is forwarded is that resolved path, so the guard and the adapter never read different paths.

use std::fmt;

/// The namespace of the adapter's own operations, refused in any spelling.
pub const ADAPTER_API: &str = "api";
/// The most rounds of percent-decoding a path may need; one that still changes after them is
/// refused as malformed.
pub const DECODE_ROUNDS_MAX: usize = 4;
/// The longest path judged, in bytes as received.
pub const PATH_MAX_BYTES: usize = 2_048;

/// Why a viewport path is not forwarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ViewportRefusal {
    /// It resolves into the adapter's `api/` namespace (403).
    AdapterApi,
    /// It cannot be read as a path: a broken escape, a control byte, text that is not UTF-8,
    /// too long, or encoded more deeply than [`DECODE_ROUNDS_MAX`] (400).
    Malformed(&'static str),
}

impl ViewportRefusal {
    /// The stable code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::AdapterApi => "viewport_path_refused",
            Self::Malformed(_) => "viewport_path_invalid",
        }
    }
}

impl fmt::Display for ViewportRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AdapterApi => write!(
                f,
                "the media adapter's {ADAPTER_API}/ namespace is not served to viewers"
            ),
            Self::Malformed(why) => write!(f, "the viewport path {why}"),
        }
    }
}

/// The path to forward to the adapter for `raw`, the request's path after the viewport prefix
/// (without its query): relative, its segments joined by `/`, empty for the client's index.
///
/// # Errors
/// [`ViewportRefusal::AdapterApi`] for any path the adapter would route into `api/`,
/// [`ViewportRefusal::Malformed`] for one that cannot be read.
pub fn resolve(raw: &str) -> Result<String, ViewportRefusal> {
    if raw.len() > PATH_MAX_BYTES {
        return Err(ViewportRefusal::Malformed("is too long"));
    }
    let mut text = raw.to_owned();
    let mut rounds = 0;
    loop {
        let decoded = percent_decode(&text)?;
        if decoded == text {
            break;
        }
        rounds += 1;
        if rounds > DECODE_ROUNDS_MAX {
            return Err(ViewportRefusal::Malformed("is encoded too many times"));
        }
        text = decoded;
    }
    if text.chars().any(char::is_control) {
        return Err(ViewportRefusal::Malformed("has a control character"));
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in text.split(['/', '\\']) {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    let first = segments
        .first()
        .map(|segment| segment.split(';').next().unwrap_or_default());
    if first.is_some_and(|name| name.trim().eq_ignore_ascii_case(ADAPTER_API)) {
        return Err(ViewportRefusal::AdapterApi);
    }
    Ok(segments.join("/"))
}

/// One round of percent-decoding; `+` is left as it is (a path is not a form).
fn percent_decode(text: &str) -> Result<String, ViewportRefusal> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .filter(|pair| pair.iter().all(u8::is_ascii_hexdigit))
                .and_then(|pair| std::str::from_utf8(pair).ok())
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or(ViewportRefusal::Malformed("has a broken percent escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| ViewportRefusal::Malformed("does not decode to UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every spelling here routes into the adapter's `api/` namespace.
    const INTO_API: &[&str] = &[
        "api",
        "api/",
        "api/room",
        "api/room/screen",
        "api/login",
        "/api/login",
        "API/login",
        "Api/room",
        " api/room",
        "api;x=1/room",
        "api%2Froom",
        "api%2froom",
        "%61pi/room",
        "%61%70%69/room",
        "%2561pi/room",
        "api%252Froom",
        "%25252561pi/room",
        "./api/",
        "./api/room",
        ".//api/room",
        "//api/room",
        "x/../api/",
        "x/../api/login",
        "x/y/../../api/room",
        "../api/room",
        "../../../api/room",
        "x/%2e%2e/api/room",
        "x/%2E%2E/api/room",
        "x%2f..%2fapi%2froom",
        "x/%252e%252e/api/room",
        "%2e/api/room",
        "x\\..\\api\\room",
        "x%5c..%5capi%5croom",
        "static/../../api/room",
        "./x/./../api",
    ];

    #[test]
    fn brow_08_every_spelling_that_resolves_into_api_is_refused() {
        for path in INTO_API {
            assert_eq!(
                resolve(path),
                Err(ViewportRefusal::AdapterApi),
                "{path:?} must be refused"
            );
        }
        assert_eq!(ViewportRefusal::AdapterApi.code(), "viewport_path_refused");
    }

    #[test]
    fn brow_08_the_static_client_is_forwarded_as_resolved() {
        let served = [
            ("", ""),
            ("/", ""),
            ("index.html", "index.html"),
            ("./client.js", "client.js"),
            ("assets/app.css", "assets/app.css"),
            ("assets//app.css", "assets/app.css"),
            ("api.js", "api.js"),
            ("apis/x", "apis/x"),
            ("x/api/room", "x/api/room"),
            ("assets/../index.html", "index.html"),
            ("a%20b.png", "a b.png"),
            ("ws", "ws"),
        ];
        for (path, forwarded) in served {
            assert_eq!(resolve(path).as_deref(), Ok(forwarded), "{path:?}");
        }
    }

    #[test]
    fn brow_08_an_unreadable_path_is_refused_as_malformed() {
        for (path, why) in [
            ("%zz", "has a broken percent escape"),
            ("%+f/room", "has a broken percent escape"),
            ("%2", "has a broken percent escape"),
            ("a%00b", "has a control character"),
            ("a%0d%0ab", "has a control character"),
            ("%ff", "does not decode to UTF-8"),
            ("%252525252561pi", "is encoded too many times"),
        ] {
            assert_eq!(
                resolve(path),
                Err(ViewportRefusal::Malformed(why)),
                "{path:?}"
            );
        }
        let long = "a/".repeat(PATH_MAX_BYTES);
        assert_eq!(
            resolve(&long),
            Err(ViewportRefusal::Malformed("is too long"))
        );
        assert_eq!(
            ViewportRefusal::Malformed("x").code(),
            "viewport_path_invalid"
        );
    }
}
