//! The one resolution step from the deployment's configuration to the policy a run may use,
//! failing closed (EGR-5).
//!
//! Inputs are the raw setting values exactly as configured (`None` when the setting is absent)
//! and whether the proxy address and the field key are present. Rules:
//! - `SANDBOX_EGRESS_ENABLED`: absent means enabled (ISO-4); `true` and `false` exactly; anything
//!   else is unparseable and resolves to `isolated`, as does `false`.
//! - `SANDBOX_EGRESS_MODE`: exactly `isolated`, `public_internet`, `private_network` or
//!   `host_allowlist`. No case folding and no trimming: `Public_Internet` or `public_internet `
//!   is a value this release does not define and resolves to `isolated`, as does an absent value.
//!   (The packaged default [`DEFAULT_MODE_TEXT`] is written into fresh configurations by the
//!   configuration layer; an absent setting here means it was removed.)
//! - `SANDBOX_EGRESS_ALLOWED_PORTS`: absent means 80 and 443; otherwise a comma-separated list of
//!   1-65535 (spaces around items allowed); empty or any bad item makes the list unusable.
//! - `SANDBOX_EGRESS_PRIVATE_CIDRS` (read in `private_network` and `host_allowlist`): a list of
//!   CIDRs, each wholly inside a private block; a CIDR that is not private (`8.8.8.0/24`,
//!   `0.0.0.0/0`) makes the list unusable. `private_network` with no CIDR resolves to `isolated`.
//! - `SANDBOX_EGRESS_ALLOWED_HOSTS` (read in `host_allowlist`): exact hosts, no wildcards;
//!   `host_allowlist` with no host resolves to `isolated`.
//! - No proxy address or no field key: a non-isolated mode cannot be held, so `isolated`.
//! - `SANDBOX_EGRESS_TOKEN_TTL_SECONDS`: see [`TokenTtl::resolve`].
//!
//! Every reason for a difference between configured and effective mode is reported as a
//! [`ResolutionNote`] with a stable code, for the operator to see.

use std::fmt;

use super::policy::{AllowedHosts, AllowedPorts, Mode, Policy, PrivateCidrs};

/// The mode a fresh configuration is written with (ISO-4).
pub const DEFAULT_MODE_TEXT: &str = "public_internet";
/// The longest configured mode text kept for display.
pub const MODE_TEXT_DISPLAY_MAX_BYTES: usize = 64;

/// A grant lifetime: 1 s to [`TokenTtl::CEILING_SECONDS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenTtl {
    seconds: u64,
}

impl TokenTtl {
    /// The lifetime of fresh configurations (EGR-6): 10 minutes.
    pub const DEFAULT_SECONDS: u64 = 600;
    /// The ceiling on any lifetime (EGR-6): 4 hours.
    pub const CEILING_SECONDS: u64 = 4 * 60 * 60;
    /// The default lifetime.
    pub const DEFAULT: TokenTtl = TokenTtl {
        seconds: TokenTtl::DEFAULT_SECONDS,
    };

    /// A lifetime of `seconds`, if within 1 s and the ceiling.
    #[must_use]
    pub fn from_seconds(seconds: u64) -> Option<TokenTtl> {
        (1..=TokenTtl::CEILING_SECONDS)
            .contains(&seconds)
            .then_some(TokenTtl { seconds })
    }

    /// Resolves `SANDBOX_EGRESS_TOKEN_TTL_SECONDS`: absent is the default; plain decimal digits
    /// are honoured up to the ceiling and clamped to it above (the operator's "long" is kept as
    /// far as allowed; no value ever exceeds the ceiling); zero, a sign, spaces or anything not a
    /// number fails closed to the default 600.
    #[must_use]
    pub fn resolve(text: Option<&str>) -> (TokenTtl, Option<ResolutionNote>) {
        let Some(text) = text else {
            return (TokenTtl::DEFAULT, None);
        };
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return (TokenTtl::DEFAULT, Some(ResolutionNote::TokenTtlUnusable));
        }
        // Only overflow can fail here: all digits, so it is a number above the ceiling.
        let seconds = text.parse::<u64>().unwrap_or(u64::MAX);
        match TokenTtl::from_seconds(seconds) {
            Some(ttl) => (ttl, None),
            None if seconds == 0 => (TokenTtl::DEFAULT, Some(ResolutionNote::TokenTtlUnusable)),
            None => (
                TokenTtl {
                    seconds: TokenTtl::CEILING_SECONDS,
                },
                Some(ResolutionNote::TokenTtlClamped),
            ),
        }
    }

    /// The lifetime in seconds.
    #[must_use]
    pub fn seconds(self) -> u64 {
        self.seconds
    }

    /// The lifetime in milliseconds.
    #[must_use]
    pub fn millis(self) -> u64 {
        self.seconds.saturating_mul(1000)
    }
}

impl Default for TokenTtl {
    fn default() -> Self {
        TokenTtl::DEFAULT
    }
}

/// The mode as configured, before it is checked for enforceability.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConfiguredMode {
    /// The setting is absent.
    Missing,
    /// A mode this release defines.
    Known(Mode),
    /// A value this release does not define, kept for display: at most
    /// [`MODE_TEXT_DISPLAY_MAX_BYTES`], printable ASCII (other bytes shown as `?`).
    Unknown(String),
}

impl ConfiguredMode {
    fn from_setting(text: Option<&str>) -> ConfiguredMode {
        let Some(text) = text else {
            return ConfiguredMode::Missing;
        };
        match Mode::parse(text) {
            Some(mode) => ConfiguredMode::Known(mode),
            None => ConfiguredMode::Unknown(
                text.chars()
                    .take(MODE_TEXT_DISPLAY_MAX_BYTES)
                    .map(|c| {
                        if c.is_ascii_graphic() || c == ' ' {
                            c
                        } else {
                            '?'
                        }
                    })
                    .collect(),
            ),
        }
    }

    /// How to show it: the mode's spelling, `(missing)`, or the unknown text.
    #[must_use]
    pub fn display_text(&self) -> &str {
        match self {
            ConfiguredMode::Missing => "(missing)",
            ConfiguredMode::Known(mode) => mode.as_str(),
            ConfiguredMode::Unknown(text) => text,
        }
    }
}

/// Why the effective policy differs from the configuration, or a setting was replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResolutionNote {
    /// `SANDBOX_EGRESS_ENABLED` is `false`.
    EgressDisabled,
    /// `SANDBOX_EGRESS_ENABLED` is neither `true` nor `false`.
    EnabledUnparseable,
    /// `SANDBOX_EGRESS_MODE` is absent.
    ModeMissing,
    /// `SANDBOX_EGRESS_MODE` is not a mode this release defines (spelling is exact).
    ModeUnknown,
    /// `SANDBOX_EGRESS_ALLOWED_PORTS` is empty or holds a bad item.
    PortsUnusable,
    /// No proxy address is configured.
    ProxyAddressMissing,
    /// No field key is configured, so no grant can be signed.
    FieldKeyMissing,
    /// `SANDBOX_EGRESS_PRIVATE_CIDRS` holds a bad or non-private item.
    PrivateCidrsUnusable,
    /// `private_network` with no private CIDR.
    PrivateCidrsMissing,
    /// `SANDBOX_EGRESS_ALLOWED_HOSTS` holds a bad item.
    AllowedHostsUnusable,
    /// `host_allowlist` with no host.
    AllowedHostsMissing,
    /// `SANDBOX_EGRESS_TOKEN_TTL_SECONDS` is not a positive number: the default is used.
    TokenTtlUnusable,
    /// `SANDBOX_EGRESS_TOKEN_TTL_SECONDS` is above the ceiling: the ceiling is used.
    TokenTtlClamped,
}

impl ResolutionNote {
    /// The stable snake_case code.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            ResolutionNote::EgressDisabled => "egress_disabled",
            ResolutionNote::EnabledUnparseable => "enabled_unparseable",
            ResolutionNote::ModeMissing => "mode_missing",
            ResolutionNote::ModeUnknown => "mode_unknown",
            ResolutionNote::PortsUnusable => "ports_unusable",
            ResolutionNote::ProxyAddressMissing => "proxy_address_missing",
            ResolutionNote::FieldKeyMissing => "field_key_missing",
            ResolutionNote::PrivateCidrsUnusable => "private_cidrs_unusable",
            ResolutionNote::PrivateCidrsMissing => "private_cidrs_missing",
            ResolutionNote::AllowedHostsUnusable => "allowed_hosts_unusable",
            ResolutionNote::AllowedHostsMissing => "allowed_hosts_missing",
            ResolutionNote::TokenTtlUnusable => "token_ttl_unusable",
            ResolutionNote::TokenTtlClamped => "token_ttl_clamped",
        }
    }
}

impl fmt::Display for ResolutionNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// The raw egress settings, exactly as configured; `None` when a setting is absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressSettings<'a> {
    /// `SANDBOX_EGRESS_ENABLED`.
    pub enabled: Option<&'a str>,
    /// `SANDBOX_EGRESS_MODE`.
    pub mode: Option<&'a str>,
    /// `SANDBOX_EGRESS_ALLOWED_PORTS`.
    pub allowed_ports: Option<&'a str>,
    /// `SANDBOX_EGRESS_PRIVATE_CIDRS`.
    pub private_cidrs: Option<&'a str>,
    /// `SANDBOX_EGRESS_ALLOWED_HOSTS`.
    pub allowed_hosts: Option<&'a str>,
    /// `SANDBOX_EGRESS_TOKEN_TTL_SECONDS`.
    pub token_ttl_seconds: Option<&'a str>,
    /// Whether a (non-empty) proxy address is configured.
    pub proxy_address_present: bool,
    /// Whether a (non-empty) field key is configured.
    pub field_key_present: bool,
}

/// The outcome of resolution: what was configured, the policy in force, and why they differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The mode as configured.
    pub configured: ConfiguredMode,
    /// The effective policy; its mode is the effective mode.
    pub policy: Policy,
    /// The grant lifetime to use.
    pub token_ttl: TokenTtl,
    /// Every reason the effective policy or lifetime differs from the configuration, in a fixed
    /// order; empty when the configuration is in force as written.
    pub notes: Vec<ResolutionNote>,
}

impl Resolution {
    /// The effective mode.
    #[must_use]
    pub fn effective_mode(&self) -> Mode {
        self.policy.mode()
    }
}

/// Resolves the settings to the policy in force, failing closed (EGR-5).
#[must_use]
pub fn resolve(settings: &EgressSettings<'_>) -> Resolution {
    let mut notes = Vec::new();
    let enabled = match settings.enabled {
        None | Some("true") => true,
        Some("false") => {
            notes.push(ResolutionNote::EgressDisabled);
            false
        }
        Some(_) => {
            notes.push(ResolutionNote::EnabledUnparseable);
            false
        }
    };
    let configured = ConfiguredMode::from_setting(settings.mode);
    let candidate = match &configured {
        ConfiguredMode::Missing => {
            notes.push(ResolutionNote::ModeMissing);
            None
        }
        ConfiguredMode::Unknown(_) => {
            notes.push(ResolutionNote::ModeUnknown);
            None
        }
        ConfiguredMode::Known(Mode::Isolated) => None,
        ConfiguredMode::Known(mode) => enforceable_policy(*mode, settings, &mut notes),
    };
    let (token_ttl, ttl_note) = TokenTtl::resolve(settings.token_ttl_seconds);
    notes.extend(ttl_note);
    let policy = match candidate {
        Some(policy) if enabled => policy,
        Some(_) | None => Policy::Isolated,
    };
    Resolution {
        configured,
        policy,
        token_ttl,
        notes,
    }
}

/// The policy for a non-isolated mode if every prerequisite holds; otherwise `None`, with a note
/// for each missing one.
fn enforceable_policy(
    mode: Mode,
    settings: &EgressSettings<'_>,
    notes: &mut Vec<ResolutionNote>,
) -> Option<Policy> {
    let ports = match settings.allowed_ports {
        None => Some(AllowedPorts::web_default()),
        Some(text) => AllowedPorts::parse_list(text).ok(),
    };
    if ports.is_none() {
        notes.push(ResolutionNote::PortsUnusable);
    }
    if !settings.proxy_address_present {
        notes.push(ResolutionNote::ProxyAddressMissing);
    }
    if !settings.field_key_present {
        notes.push(ResolutionNote::FieldKeyMissing);
    }
    let prerequisites =
        ports.filter(|_| settings.proxy_address_present && settings.field_key_present);
    match mode {
        Mode::Isolated => None,
        Mode::PublicInternet => prerequisites.map(|ports| Policy::PublicInternet { ports }),
        Mode::PrivateNetwork => {
            let cidrs = private_cidrs(settings, notes)?;
            if cidrs.is_empty() {
                notes.push(ResolutionNote::PrivateCidrsMissing);
                return None;
            }
            prerequisites.map(|ports| Policy::PrivateNetwork { ports, cidrs })
        }
        Mode::HostAllowlist => {
            let cidrs = private_cidrs(settings, notes);
            let hosts = match AllowedHosts::parse_list(settings.allowed_hosts.unwrap_or("")) {
                Ok(hosts) if hosts.is_empty() => {
                    notes.push(ResolutionNote::AllowedHostsMissing);
                    None
                }
                Ok(hosts) => Some(hosts),
                Err(_) => {
                    notes.push(ResolutionNote::AllowedHostsUnusable);
                    None
                }
            };
            let (ports, hosts, cidrs) = (prerequisites?, hosts?, cidrs?);
            Some(Policy::HostAllowlist {
                ports,
                hosts,
                cidrs,
            })
        }
    }
}

fn private_cidrs(
    settings: &EgressSettings<'_>,
    notes: &mut Vec<ResolutionNote>,
) -> Option<PrivateCidrs> {
    match PrivateCidrs::parse_list(settings.private_cidrs.unwrap_or("")) {
        Ok(cidrs) => Some(cidrs),
        Err(_) => {
            notes.push(ResolutionNote::PrivateCidrsUnusable);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(mode: &str) -> EgressSettings<'_> {
        EgressSettings {
            mode: Some(mode),
            proxy_address_present: true,
            field_key_present: true,
            ..EgressSettings::default()
        }
    }

    fn codes(r: &Resolution) -> Vec<&'static str> {
        r.notes.iter().map(|n| n.code()).collect()
    }

    #[test]
    fn egr_05_public_internet_in_force_when_enforceable() {
        let r = resolve(&ready("public_internet"));
        assert_eq!(r.configured, ConfiguredMode::Known(Mode::PublicInternet));
        assert_eq!(
            r.policy,
            Policy::PublicInternet {
                ports: AllowedPorts::web_default()
            }
        );
        assert!(r.notes.is_empty());
        assert_eq!(r.token_ttl.seconds(), 600);
    }

    #[test]
    fn egr_05_unknown_mode_resolves_isolated() {
        for text in [
            "public-internet",
            "Public_Internet",
            "PUBLIC_INTERNET",
            " public_internet",
            "public_internet\n",
            "open",
            "",
            "host_allowlist_v2",
            "isolated ",
        ] {
            let r = resolve(&ready(text));
            assert_eq!(r.effective_mode(), Mode::Isolated, "{text:?}");
            assert_eq!(codes(&r), vec!["mode_unknown"], "{text:?}");
            assert!(matches!(r.configured, ConfiguredMode::Unknown(_)));
        }
    }

    #[test]
    fn egr_05_missing_mode_resolves_isolated() {
        let r = resolve(&EgressSettings {
            mode: None,
            ..ready("")
        });
        assert_eq!(r.effective_mode(), Mode::Isolated);
        assert_eq!(r.configured, ConfiguredMode::Missing);
        assert_eq!(codes(&r), vec!["mode_missing"]);
    }

    #[test]
    fn egr_05_unusable_ports_resolve_isolated() {
        for text in ["", "0", "80,", "http", "80;443", "70000"] {
            let r = resolve(&EgressSettings {
                allowed_ports: Some(text),
                ..ready("public_internet")
            });
            assert_eq!(r.effective_mode(), Mode::Isolated, "{text:?}");
            assert_eq!(codes(&r), vec!["ports_unusable"]);
        }
        let r = resolve(&EgressSettings {
            allowed_ports: Some("8080"),
            ..ready("public_internet")
        });
        assert_eq!(
            r.policy,
            Policy::PublicInternet {
                ports: AllowedPorts::new([8080]).unwrap()
            }
        );
    }

    #[test]
    fn egr_05_no_proxy_address_or_field_key_resolves_isolated() {
        let r = resolve(&EgressSettings {
            proxy_address_present: false,
            ..ready("public_internet")
        });
        assert_eq!(r.effective_mode(), Mode::Isolated);
        assert_eq!(codes(&r), vec!["proxy_address_missing"]);
        let r = resolve(&EgressSettings {
            field_key_present: false,
            ..ready("private_network")
        });
        assert_eq!(r.effective_mode(), Mode::Isolated);
        assert!(codes(&r).contains(&"field_key_missing"));
        let r = resolve(&EgressSettings {
            proxy_address_present: false,
            field_key_present: false,
            ..ready("public_internet")
        });
        assert_eq!(
            codes(&r),
            vec!["proxy_address_missing", "field_key_missing"]
        );
    }

    #[test]
    fn egr_05_disabled_or_unparseable_enabled_resolves_isolated() {
        let r = resolve(&EgressSettings {
            enabled: Some("false"),
            ..ready("public_internet")
        });
        assert_eq!(r.effective_mode(), Mode::Isolated);
        assert_eq!(codes(&r), vec!["egress_disabled"]);
        for text in ["False", "no", "0", "", "yes", "TRUE", "true "] {
            let r = resolve(&EgressSettings {
                enabled: Some(text),
                ..ready("public_internet")
            });
            assert_eq!(r.effective_mode(), Mode::Isolated, "{text:?}");
            assert_eq!(codes(&r), vec!["enabled_unparseable"], "{text:?}");
        }
        let r = resolve(&EgressSettings {
            enabled: Some("true"),
            ..ready("public_internet")
        });
        assert_eq!(r.effective_mode(), Mode::PublicInternet);
    }

    #[test]
    fn iso_04_absent_enabled_means_enabled() {
        let r = resolve(&ready(DEFAULT_MODE_TEXT));
        assert_eq!(r.effective_mode(), Mode::PublicInternet);
    }

    #[test]
    fn egr_05_isolated_needs_nothing_and_reports_nothing() {
        let r = resolve(&EgressSettings {
            mode: Some("isolated"),
            ..EgressSettings::default()
        });
        assert_eq!(r.effective_mode(), Mode::Isolated);
        assert!(r.notes.is_empty());
    }

    #[test]
    fn egr_05_private_network_needs_private_cidrs() {
        let r = resolve(&ready("private_network"));
        assert_eq!(r.effective_mode(), Mode::Isolated);
        assert_eq!(codes(&r), vec!["private_cidrs_missing"]);
        let r = resolve(&EgressSettings {
            private_cidrs: Some("10.0.0.0/8,8.8.8.0/24"),
            ..ready("private_network")
        });
        assert_eq!(r.effective_mode(), Mode::Isolated);
        assert_eq!(codes(&r), vec!["private_cidrs_unusable"]);
        let r = resolve(&EgressSettings {
            private_cidrs: Some("0.0.0.0/0"),
            ..ready("private_network")
        });
        assert_eq!(codes(&r), vec!["private_cidrs_unusable"]);
        let r = resolve(&EgressSettings {
            private_cidrs: Some("10.1.0.0/16"),
            ..ready("private_network")
        });
        assert_eq!(r.effective_mode(), Mode::PrivateNetwork);
        assert!(r.notes.is_empty());
    }

    #[test]
    fn egr_05_host_allowlist_needs_usable_hosts() {
        let r = resolve(&ready("host_allowlist"));
        assert_eq!(r.effective_mode(), Mode::Isolated);
        assert_eq!(codes(&r), vec!["allowed_hosts_missing"]);
        let r = resolve(&EgressSettings {
            allowed_hosts: Some("pypi.org,*.npmjs.org"),
            ..ready("host_allowlist")
        });
        assert_eq!(codes(&r), vec!["allowed_hosts_unusable"]);
        let r = resolve(&EgressSettings {
            allowed_hosts: Some("pypi.org"),
            private_cidrs: Some("8.8.8.0/24"),
            ..ready("host_allowlist")
        });
        assert_eq!(r.effective_mode(), Mode::Isolated);
        assert_eq!(codes(&r), vec!["private_cidrs_unusable"]);
        let r = resolve(&EgressSettings {
            allowed_hosts: Some("pypi.org"),
            ..ready("host_allowlist")
        });
        assert_eq!(r.effective_mode(), Mode::HostAllowlist);
    }

    #[test]
    fn public_internet_ignores_private_settings() {
        let r = resolve(&EgressSettings {
            private_cidrs: Some("garbage"),
            allowed_hosts: Some("*"),
            ..ready("public_internet")
        });
        assert_eq!(r.effective_mode(), Mode::PublicInternet);
        assert!(r.notes.is_empty());
    }

    #[test]
    fn unknown_mode_text_is_bounded_and_printable() {
        let long = format!("x\u{7}{}", "y".repeat(200));
        let r = resolve(&ready(&long));
        let ConfiguredMode::Unknown(text) = &r.configured else {
            panic!("unknown")
        };
        assert_eq!(text.chars().count(), MODE_TEXT_DISPLAY_MAX_BYTES);
        assert!(text.starts_with("x?y"));
    }

    #[test]
    fn note_codes_are_unique_snake_case() {
        use std::collections::BTreeSet;
        let all = [
            ResolutionNote::EgressDisabled,
            ResolutionNote::EnabledUnparseable,
            ResolutionNote::ModeMissing,
            ResolutionNote::ModeUnknown,
            ResolutionNote::PortsUnusable,
            ResolutionNote::ProxyAddressMissing,
            ResolutionNote::FieldKeyMissing,
            ResolutionNote::PrivateCidrsUnusable,
            ResolutionNote::PrivateCidrsMissing,
            ResolutionNote::AllowedHostsUnusable,
            ResolutionNote::AllowedHostsMissing,
            ResolutionNote::TokenTtlUnusable,
            ResolutionNote::TokenTtlClamped,
        ];
        let codes: BTreeSet<&str> = all.iter().map(|n| n.code()).collect();
        assert_eq!(codes.len(), all.len());
        assert!(
            codes
                .iter()
                .all(|c| crate::egress::reason::is_snake_case(c))
        );
    }

    #[test]
    fn egr_06_default_ttl_is_ten_minutes() {
        assert_eq!(TokenTtl::resolve(None), (TokenTtl::DEFAULT, None));
        assert_eq!(TokenTtl::DEFAULT.seconds(), 600);
        assert_eq!(TokenTtl::default().millis(), 600_000);
    }

    #[test]
    fn egr_06_explicit_ttl_is_honoured_up_to_four_hours_and_clamped_above() {
        assert_eq!(TokenTtl::resolve(Some("60")).0.seconds(), 60);
        assert_eq!(
            TokenTtl::resolve(Some("14400")),
            (TokenTtl::from_seconds(14_400).unwrap(), None)
        );
        assert_eq!(
            TokenTtl::resolve(Some("14401")),
            (
                TokenTtl::from_seconds(14_400).unwrap(),
                Some(ResolutionNote::TokenTtlClamped)
            )
        );
        assert_eq!(
            TokenTtl::resolve(Some("99999999999999999999999"))
                .0
                .seconds(),
            14_400
        );
    }

    #[test]
    fn egr_06_non_number_ttl_fails_closed_to_the_default() {
        for text in ["", "ten", "-5", "+600", " 600", "600s", "6e2", "0", "1.5"] {
            assert_eq!(
                TokenTtl::resolve(Some(text)),
                (TokenTtl::DEFAULT, Some(ResolutionNote::TokenTtlUnusable)),
                "{text:?}"
            );
        }
    }
}
