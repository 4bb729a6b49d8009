//! Unit tests of parsing, defaults, relations and descriptions, and property tests of the whole.

use std::cell::RefCell;
use std::collections::BTreeSet;

use proptest::prelude::*;

use super::number::Number;
use super::*;

fn parse(pairs: &[(&str, &str)]) -> Settings {
    match Settings::from_pairs(pairs) {
        Ok(settings) => settings,
        Err(error) => panic!("{pairs:?} refused: {error}"),
    }
}

fn refuse(pairs: &[(&str, &str)]) -> ConfigError {
    match Settings::from_pairs(pairs) {
        Ok(settings) => panic!("{pairs:?} accepted: {settings:?}"),
        Err(error) => error,
    }
}

/// Asserts a relation error naming both settings, in its fields and in its message.
fn assert_relation(pairs: &[(&str, &str)], setting: &str, other: &str) {
    let error = refuse(pairs);
    assert_eq!(error.code(), "config_relation", "{error}");
    assert_eq!(error.setting(), setting, "{error}");
    let ConfigError::Relation { other: named, .. } = &error else {
        panic!("not a relation: {error:?}");
    };
    assert_eq!(*named, other);
    let message = error.to_string();
    assert!(
        message.contains(setting) && message.contains(other),
        "{message}"
    );
}

#[test]
fn pool_01_defaults_match_the_specification() {
    let s = Settings::default();
    assert_eq!(s.warm_pool_min, 3);
    assert_eq!(s.pool_target_idle, 1);
    assert_eq!(s.pool_max_allocated, 32);
    assert_eq!(s.max_concurrent_creates, 3);
    assert_eq!(s.burst_idle_ttl_seconds, 300);
    assert_eq!(s.acquire_wait_seconds, 30);
    assert_eq!(s.acquire_queue_max, 256);
    assert_eq!(s.max_concurrent_per_member, 2);
    assert_eq!(Settings::from_lookup(|_| None), Ok(s.clone()));
    let pool = s.pool();
    assert_eq!(pool, PoolConfig::default());
    assert_eq!(
        (pool.burst_idle_ttl_ms, pool.acquire_wait_ms),
        (300_000, 30_000)
    );
}

#[test]
fn lease_defaults_match_the_specification() {
    let s = Settings::default();
    assert_eq!((s.lease_heartbeat_seconds, s.lease_ttl_seconds), (60, 900));
    assert_eq!(
        (s.pool().lease_heartbeat_ms, s.pool().lease_ttl_ms),
        (60_000, 900_000)
    );
}

#[test]
fn every_bound_names_a_documented_setting() {
    for bound in crate::bounds::Bound::ALL {
        assert!(setting_doc(bound.setting()).is_some(), "{bound:?}");
    }
}

#[test]
fn execution_bound_defaults_match_the_specification() {
    let b = Settings::default().bounds;
    assert_eq!(b.max_wall_seconds, 30);
    assert_eq!(b.max_output_bytes, 1024 * 1024);
    assert_eq!(b.max_artifact_bytes, 10 * 1024 * 1024);
    assert_eq!(b.workspace_max_bytes, 8 * 1024 * 1024);
    assert_eq!(b.hashline_state_max_bytes, 64 * 1024 * 1024);
    assert_eq!(b.dependency_install_timeout_seconds, 120);
}

#[test]
fn corral_own_defaults() {
    let s = Settings::default();
    assert_eq!(s.bounds.max_memory_bytes, 512 * 1024 * 1024);
    assert_eq!(s.bounds.max_processes, 64);
    assert_eq!(s.bounds.tmp_max_bytes, 64 * 1024 * 1024);
    assert_eq!(
        (
            s.create_timeout_seconds,
            s.reset_timeout_seconds,
            s.delete_retry_seconds
        ),
        (120, 30, 10)
    );
    assert_eq!(s.inventory_stale_seconds, 30);
    assert_eq!(s.pool_mode, PoolModeSetting::Controller);
    assert_eq!(s.claim_lifetime_seconds, 3600);
    assert_eq!(
        s.worker,
        WorkerPorts {
            control_port: 8091,
            browser_port: 8080
        }
    );
    assert_eq!(s.field_key, FieldKeySource::Unset);
}

#[test]
fn workspace_persist_defaults_on() {
    assert!(Settings::default().workspace_persist);
    assert!(!parse(&[("SANDBOX_WORKSPACE_PERSIST", "off")]).workspace_persist);
}

#[test]
fn package_settings_default_to_the_specification() {
    let p = Settings::default().packages;
    assert_eq!(p.broker_url, None);
    assert_eq!(p.token_ttl_seconds, 300);
    assert_eq!(p.max_index_bytes, 8 * 1024 * 1024);
    assert_eq!(p.max_file_bytes, 100_000_000);
    assert_eq!(p.registries, PackageRegistries::PublicDefaults);
}

#[test]
fn an_empty_registry_object_parses_as_no_registry() {
    for text in ["{}", " { } ", "{\n}"] {
        let s = parse(&[("SANDBOX_PACKAGE_REGISTRIES", text)]);
        assert_eq!(
            s.packages.registries,
            PackageRegistries::Disabled,
            "{text:?}"
        );
    }
    let raw = r#"{"pypi": "https://pypi.example/simple"}"#;
    let s = parse(&[("SANDBOX_PACKAGE_REGISTRIES", raw)]);
    assert_eq!(
        s.packages.registries,
        PackageRegistries::Configured(raw.to_owned())
    );
}

#[test]
fn egr_01_egress_defaults_match_the_specification() {
    assert_eq!(EgressSettings::DEFAULT_ENABLED.to_string(), "true");
    assert_eq!(EgressSettings::DEFAULT_MODE, "public_internet");
    assert_eq!(EgressSettings::DEFAULT_ALLOWED_PORTS, "80,443");
    assert_eq!(EgressSettings::DEFAULT_TOKEN_TTL_SECONDS, 600);
    let doc_default = |name| setting_doc(name).map(|doc| doc.default);
    assert_eq!(doc_default("SANDBOX_EGRESS_ENABLED"), Some("true"));
    assert_eq!(doc_default("SANDBOX_EGRESS_MODE"), Some("public_internet"));
    assert_eq!(doc_default("SANDBOX_EGRESS_ALLOWED_PORTS"), Some("80,443"));
    assert_eq!(doc_default("SANDBOX_EGRESS_TOKEN_TTL_SECONDS"), Some("600"));
    // Unset stays unset: the egress module applies the defaults when it resolves.
    assert_eq!(Settings::default().egress, EgressSettings::default());
}

#[test]
fn egr_05_egress_values_never_fail_start_up() {
    let garbage = "\u{0}not a value;; 99999999999999999999999 -1 ✗";
    let pairs: Vec<(&str, &str)> = [
        "SANDBOX_EGRESS_ENABLED",
        "SANDBOX_EGRESS_MODE",
        "SANDBOX_EGRESS_ALLOWED_PORTS",
        "SANDBOX_EGRESS_PRIVATE_CIDRS",
        "SANDBOX_EGRESS_ALLOWED_HOSTS",
        "SANDBOX_EGRESS_PROXY_URL",
        "SANDBOX_EGRESS_DNS_SERVERS",
        "SANDBOX_EGRESS_TOKEN_TTL_SECONDS",
    ]
    .into_iter()
    .map(|name| (name, garbage))
    .collect();
    let s = parse(&pairs);
    let kept = Some(garbage.trim().to_owned());
    assert_eq!(s.egress.enabled, kept);
    assert_eq!(s.egress.mode, kept);
    assert_eq!(s.egress.allowed_ports, kept);
    assert_eq!(s.egress.private_cidrs, kept);
    assert_eq!(s.egress.allowed_hosts, kept);
    assert_eq!(s.egress.proxy_url, kept);
    assert_eq!(s.egress.dns_servers, kept);
    assert_eq!(s.egress.token_ttl_seconds, kept);
    let s = parse(&[
        ("SANDBOX_EGRESS_MODE", "  host_allowlist \n"),
        ("SANDBOX_EGRESS_ENABLED", " "),
    ]);
    assert_eq!(s.egress.mode.as_deref(), Some("host_allowlist"));
    assert_eq!(s.egress.enabled, None);
}

#[test]
fn every_setting_in_the_table_is_read_and_nothing_else() {
    let asked: RefCell<Vec<String>> = RefCell::new(Vec::new());
    let result = Settings::from_lookup(|name| {
        asked.borrow_mut().push(name.to_owned());
        None
    });
    assert!(result.is_ok());
    let asked = asked.into_inner();
    let unique: BTreeSet<&str> = asked.iter().map(String::as_str).collect();
    assert_eq!(
        unique.len(),
        asked.len(),
        "a setting is looked up twice: {asked:?}"
    );
    // A sim-mutations build also reads the mutation to break, which is no setting of the shipped
    // binary's table.
    #[cfg(feature = "sim-mutations")]
    let unique = {
        let mut unique = unique;
        assert!(unique.remove(super::SIM_MUTATION_SETTING), "{asked:?}");
        unique
    };
    let table: BTreeSet<&str> = SETTINGS.iter().map(|doc| doc.name).collect();
    assert_eq!(table.len(), SETTINGS.len(), "a setting is listed twice");
    assert_eq!(unique, table);
}

#[test]
fn describe_lists_every_setting_in_table_order() {
    let described: Vec<&str> = Settings::default()
        .describe()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let table: Vec<&str> = SETTINGS.iter().map(|doc| doc.name).collect();
    assert_eq!(described, table);
}

#[test]
fn table_is_complete_and_its_defaults_parse_to_the_defaults() {
    for doc in SETTINGS {
        assert!(
            !doc.meaning.is_empty() && !doc.requirement.is_empty(),
            "{}",
            doc.name
        );
        assert!(
            doc.name.starts_with("SANDBOX_") || doc.name.starts_with("CORRAL_"),
            "{}",
            doc.name
        );
        // Egress values are kept raw, so writing their default is not the same as leaving it unset.
        if doc.default.is_empty() || doc.name.starts_with("SANDBOX_EGRESS_") {
            continue;
        }
        let parsed = parse(&[(doc.name, doc.default)]);
        assert_eq!(parsed, Settings::default(), "{}={}", doc.name, doc.default);
    }
}

#[test]
fn describe_shows_the_effective_values() {
    let described = Settings::default().describe();
    let value = |name: &str| {
        described
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(value("SANDBOX_MAX_OUTPUT_BYTES"), "1048576");
    assert_eq!(value("SANDBOX_WORKSPACE_PERSIST"), "true");
    assert_eq!(value("CORRAL_POOL_MODE"), "controller");
    assert_eq!(value("SANDBOX_EGRESS_MODE"), "<unset>");
    assert_eq!(value("SANDBOX_FIELD_KEY"), "<unset>");
    // Every described value reads back as the same settings.
    let pairs: Vec<(&str, &str)> = described
        .iter()
        .filter(|(_, v)| !v.starts_with('<'))
        .map(|(n, v)| (*n, v.as_str()))
        .collect();
    let mut reread = parse(&pairs);
    reread.egress = EgressSettings::default();
    assert_eq!(reread, Settings::default());
}

#[test]
fn describe_redacts_credentials_in_urls() {
    let s = parse(&[
        ("SANDBOX_EGRESS_PROXY_URL", "http://user:pw@proxy:3128/x"),
        ("SANDBOX_PACKAGE_BROKER_URL", "https://tok@api:8000/simple"),
    ]);
    let text = format!("{:?}", s.describe());
    assert!(!text.contains("pw") && !text.contains("tok@"), "{text}");
    assert!(text.contains("http://<redacted>@proxy:3128/x"), "{text}");
    assert!(
        text.contains("https://<redacted>@api:8000/simple"),
        "{text}"
    );
}

#[test]
fn field_key_never_appears_in_debug_describe_or_errors() {
    let secret = "s3cr3t-field-key-Zq9";
    let s = parse(&[("SANDBOX_FIELD_KEY", secret)]);
    let FieldKeySource::Value(key) = &s.field_key else {
        panic!("field key not kept: {:?}", s.field_key);
    };
    assert_eq!(key.expose_secret(), secret);
    for text in [
        format!("{s:?}"),
        format!("{s:#?}"),
        format!("{:?}", s.describe()),
    ] {
        assert!(!text.contains(secret), "{text}");
    }
    let described = s.describe();
    assert!(described.contains(&("SANDBOX_FIELD_KEY", "<set>".to_owned())));
    let error = refuse(&[
        ("SANDBOX_FIELD_KEY", secret),
        ("SANDBOX_FIELD_KEY_FILE", "/run/key"),
    ]);
    assert_eq!(error.code(), "config_conflict");
    assert!(!error.to_string().contains(secret) && !format!("{error:?}").contains(secret));
    let error = refuse(&[
        ("SANDBOX_FIELD_KEY", secret),
        ("SANDBOX_POOL_MAX_ALLOCATED", "0"),
    ]);
    assert!(!error.to_string().contains(secret));
}

#[test]
fn field_key_file_keeps_the_path() {
    let s = parse(&[("SANDBOX_FIELD_KEY_FILE", " /run/secrets/field-key ")]);
    assert_eq!(
        s.field_key,
        FieldKeySource::File("/run/secrets/field-key".to_owned())
    );
    let described = s.describe();
    assert!(described.contains(&("SANDBOX_FIELD_KEY", "<unset>".to_owned())));
    assert!(described.contains(&(
        "SANDBOX_FIELD_KEY_FILE",
        "/run/secrets/field-key".to_owned()
    )));
}

#[test]
fn a_bad_number_names_the_setting() {
    let error = refuse(&[("SANDBOX_POOL_MAX_ALLOCATED", "abc")]);
    assert_eq!(error.code(), "config_invalid_number");
    assert_eq!(
        error.to_string(),
        r#"SANDBOX_POOL_MAX_ALLOCATED="abc": expected a whole number from 1 to 100000"#
    );
    for (name, value) in [
        ("SANDBOX_ACQUIRE_WAIT_SECONDS", "30s"),
        ("SANDBOX_LEASE_TTL_SECONDS", "-1"),
        ("SANDBOX_WARM_POOL_MIN", "+3"),
        ("SANDBOX_MAX_OUTPUT_BYTES", "1 MiBs"),
        ("SANDBOX_MAX_OUTPUT_BYTES", "1.5 MiB"),
        ("SANDBOX_TMP_MAX_BYTES", "MiB"),
        ("CORRAL_WORKER_CONTROL_PORT", "http"),
    ] {
        let error = refuse(&[(name, value)]);
        assert_eq!(error.code(), "config_invalid_number", "{name}={value}");
        assert_eq!(error.setting(), name);
        assert!(
            error
                .to_string()
                .starts_with(&format!("{name}={value:?}: expected ")),
            "{error}"
        );
    }
}

#[test]
fn zero_where_it_makes_no_sense_is_refused() {
    for name in [
        "SANDBOX_POOL_MAX_ALLOCATED",
        "SANDBOX_MAX_CONCURRENT_CREATES",
        "SANDBOX_ACQUIRE_WAIT_SECONDS",
        "SANDBOX_ACQUIRE_QUEUE_MAX",
        "SANDBOX_MAX_CONCURRENT_PER_MEMBER",
        "SANDBOX_LEASE_HEARTBEAT_SECONDS",
        "SANDBOX_MAX_WALL_SECONDS",
        "SANDBOX_MAX_OUTPUT_BYTES",
        "SANDBOX_MAX_ARTIFACT_BYTES",
        "SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS",
        "CORRAL_INVENTORY_STALE_SECONDS",
        "CORRAL_CREATE_TIMEOUT_SECONDS",
        "CORRAL_WORKER_CONTROL_PORT",
    ] {
        let error = refuse(&[(name, "0")]);
        assert_eq!(error.code(), "config_out_of_range", "{name}");
        assert_eq!(error.setting(), name);
    }
    // Zero is meaningful here: no warm floor, no idle target, retire burst capacity at once.
    let s = parse(&[
        ("SANDBOX_WARM_POOL_MIN", "0"),
        ("SANDBOX_POOL_TARGET_IDLE", "0"),
        ("SANDBOX_BURST_IDLE_TTL_SECONDS", "0"),
    ]);
    assert_eq!(
        (
            s.warm_pool_min,
            s.pool_target_idle,
            s.burst_idle_ttl_seconds
        ),
        (0, 0, 0)
    );
}

#[test]
fn too_large_is_out_of_range() {
    for (name, value) in [
        ("SANDBOX_POOL_MAX_ALLOCATED", "100001"),
        ("SANDBOX_POOL_MAX_ALLOCATED", "99999999999999999999999999"),
        ("SANDBOX_MAX_OUTPUT_BYTES", "2 GiB"),
        ("SANDBOX_MAX_OUTPUT_BYTES", "18446744073709551615 GiB"),
        ("SANDBOX_MAX_MEMORY_BYTES", "1 MiB"),
        ("CORRAL_WORKER_BROWSER_PORT", "65536"),
    ] {
        let error = refuse(&[(name, value)]);
        assert_eq!(
            error.code(),
            "config_out_of_range",
            "{name}={value}: {error}"
        );
        assert!(
            error.to_string().starts_with(&format!("{name}=")),
            "{error}"
        );
    }
    let error = refuse(&[("SANDBOX_MAX_OUTPUT_BYTES", "2 GiB")]);
    assert!(error.to_string().contains("from 1 B to 1 GiB"), "{error}");
}

#[test]
fn byte_sizes_accept_suffixes() {
    for (value, expected) in [
        ("4096", 4096),
        ("4 KiB", 4096),
        ("4kib", 4096),
        ("2MiB", 2 * 1024 * 1024),
        ("1 GiB", 1 << 30),
        ("5 KB", 5_000),
        ("3 mb", 3_000_000),
        ("1GB", 1_000_000_000),
        ("77 B", 77),
    ] {
        let s = parse(&[("SANDBOX_MAX_ARTIFACT_BYTES", value)]);
        assert_eq!(s.bounds.max_artifact_bytes, expected, "{value}");
    }
}

#[test]
fn booleans_accept_common_spellings_and_nothing_else() {
    for (value, expected) in [
        ("true", true),
        ("TRUE", true),
        ("1", true),
        ("Yes", true),
        ("on", true),
        ("false", false),
        ("0", false),
        ("NO", false),
        ("Off", false),
    ] {
        assert_eq!(
            parse(&[("SANDBOX_WORKSPACE_PERSIST", value)]).workspace_persist,
            expected
        );
    }
    let error = refuse(&[("SANDBOX_WORKSPACE_PERSIST", "maybe")]);
    assert_eq!(error.code(), "config_invalid_bool");
    assert!(
        error
            .to_string()
            .starts_with(r#"SANDBOX_WORKSPACE_PERSIST="maybe": expected"#)
    );
}

#[test]
fn whitespace_is_trimmed_and_empty_means_unset() {
    let s = parse(&[
        ("SANDBOX_POOL_MAX_ALLOCATED", "  40\t\n"),
        ("SANDBOX_WARM_POOL_MIN", "   "),
    ]);
    assert_eq!(s.pool_max_allocated, 40);
    assert_eq!(s.warm_pool_min, 3);
}

#[test]
fn pool_07_platform_operator_mode_carries_the_claim_lifetime() {
    let s = parse(&[
        ("CORRAL_POOL_MODE", "platform_operator"),
        ("CORRAL_CLAIM_LIFETIME_SECONDS", "7200"),
    ]);
    assert_eq!(
        s.pool().mode,
        PoolMode::PlatformOperator {
            claim_lifetime_ms: 7_200_000
        }
    );
    assert_eq!(
        parse(&[("CORRAL_POOL_MODE", "Controller")]).pool().mode,
        PoolMode::Controller
    );
    let error = refuse(&[("CORRAL_POOL_MODE", "kubernetes")]);
    assert_eq!(error.code(), "config_invalid_choice");
    assert!(
        error.to_string().contains("controller, platform_operator"),
        "{error}"
    );
}

#[test]
fn pool_config_converts_seconds_to_milliseconds() {
    let s = parse(&[
        ("SANDBOX_ACQUIRE_WAIT_SECONDS", "7"),
        ("CORRAL_CREATE_TIMEOUT_SECONDS", "11"),
        ("CORRAL_RESET_TIMEOUT_SECONDS", "13"),
        ("CORRAL_DELETE_RETRY_SECONDS", "17"),
        ("CORRAL_INVENTORY_STALE_SECONDS", "19"),
    ]);
    let pool = s.pool();
    assert_eq!(pool.acquire_wait_ms, 7_000);
    assert_eq!(pool.create_timeout_ms, 11_000);
    assert_eq!(pool.reset_timeout_ms, 13_000);
    assert_eq!(pool.delete_retry_ms, 17_000);
    assert_eq!(pool.inventory_stale_ms, 19_000);
}

#[test]
fn relation_warm_minimum_above_the_ceiling() {
    let pairs = [
        ("SANDBOX_WARM_POOL_MIN", "40"),
        ("SANDBOX_POOL_MAX_ALLOCATED", "32"),
    ];
    assert_relation(
        &pairs,
        "SANDBOX_WARM_POOL_MIN",
        "SANDBOX_POOL_MAX_ALLOCATED",
    );
    assert!(
        refuse(&pairs).to_string().starts_with(
            "SANDBOX_WARM_POOL_MIN=40 must be at most SANDBOX_POOL_MAX_ALLOCATED=32: "
        )
    );
    parse(&[
        ("SANDBOX_WARM_POOL_MIN", "32"),
        ("SANDBOX_POOL_MAX_ALLOCATED", "32"),
    ]);
}

#[test]
fn relation_target_idle_above_the_ceiling() {
    assert_relation(
        &[
            ("SANDBOX_POOL_TARGET_IDLE", "5"),
            ("SANDBOX_POOL_MAX_ALLOCATED", "4"),
            ("SANDBOX_WARM_POOL_MIN", "1"),
        ],
        "SANDBOX_POOL_TARGET_IDLE",
        "SANDBOX_POOL_MAX_ALLOCATED",
    );
}

#[test]
fn relation_concurrent_creates_above_the_ceiling() {
    assert_relation(
        &[("SANDBOX_MAX_CONCURRENT_CREATES", "33")],
        "SANDBOX_MAX_CONCURRENT_CREATES",
        "SANDBOX_POOL_MAX_ALLOCATED",
    );
}

#[test]
fn relation_per_member_above_the_ceiling() {
    assert_relation(
        &[("SANDBOX_MAX_CONCURRENT_PER_MEMBER", "33")],
        "SANDBOX_MAX_CONCURRENT_PER_MEMBER",
        "SANDBOX_POOL_MAX_ALLOCATED",
    );
}

#[test]
fn relation_heartbeat_not_below_the_lease_ttl() {
    for (heartbeat, ttl) in [("900", "900"), ("901", "900"), ("60", "30")] {
        assert_relation(
            &[
                ("SANDBOX_LEASE_HEARTBEAT_SECONDS", heartbeat),
                ("SANDBOX_LEASE_TTL_SECONDS", ttl),
            ],
            "SANDBOX_LEASE_HEARTBEAT_SECONDS",
            "SANDBOX_LEASE_TTL_SECONDS",
        );
    }
    parse(&[
        ("SANDBOX_LEASE_HEARTBEAT_SECONDS", "899"),
        ("SANDBOX_LEASE_TTL_SECONDS", "900"),
    ]);
}

#[test]
fn relation_install_timeout_beyond_the_package_token() {
    assert_relation(
        &[("SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS", "301")],
        "SANDBOX_DEPENDENCY_INSTALL_TIMEOUT_SECONDS",
        "SANDBOX_PACKAGE_TOKEN_TTL_SECONDS",
    );
}

#[test]
fn relation_worker_ports_collide() {
    assert_relation(
        &[("CORRAL_WORKER_CONTROL_PORT", "8080")],
        "CORRAL_WORKER_CONTROL_PORT",
        "CORRAL_WORKER_BROWSER_PORT",
    );
}

#[test]
fn relation_claim_lifetime_within_a_heartbeat_in_platform_operator_mode() {
    let short = [("CORRAL_CLAIM_LIFETIME_SECONDS", "60")];
    // Ignored in controller mode, where there are no claims.
    parse(&short);
    assert_relation(
        &[short[0], ("CORRAL_POOL_MODE", "platform_operator")],
        "CORRAL_CLAIM_LIFETIME_SECONDS",
        "SANDBOX_LEASE_HEARTBEAT_SECONDS",
    );
}

#[test]
fn validate_catches_fields_changed_after_parsing() {
    let d = Settings::default();
    let s = Settings {
        bounds: ExecutionBounds {
            max_output_bytes: 0,
            ..d.bounds.clone()
        },
        ..d.clone()
    };
    assert_eq!(
        s.validate().map_err(|e| e.code()),
        Err("config_out_of_range")
    );
    let s = Settings {
        warm_pool_min: 33,
        ..d
    };
    assert_eq!(s.validate().map_err(|e| e.code()), Err("config_relation"));
}

#[test]
fn jail_settings_parse_fail_closed() {
    let d = Settings::default();
    assert!(!d.jail.allow_weaker_isolation);
    assert_eq!(d.jail.cgroup_root, "/sys/fs/cgroup");
    let s = parse(&[
        ("CORRAL_JAIL_ALLOW_WEAKER_ISOLATION", "1"),
        ("CORRAL_JAIL_CGROUP_ROOT", " /nonexistent/cgroup "),
    ]);
    assert!(s.jail.allow_weaker_isolation);
    assert_eq!(s.jail.cgroup_root, "/nonexistent/cgroup");
    let error = refuse(&[("CORRAL_JAIL_ALLOW_WEAKER_ISOLATION", "please")]);
    assert_eq!(error.code(), "config_invalid_bool");
    for bad in ["relative/path", "/with\nnewline", "~/cgroup"] {
        let error = refuse(&[("CORRAL_JAIL_CGROUP_ROOT", bad)]);
        assert_eq!(error.code(), "config_invalid_path", "{bad}");
        assert_eq!(error.setting(), "CORRAL_JAIL_CGROUP_ROOT");
    }
}

#[test]
fn prepare_languages_parse_fail_closed() {
    let d = Settings::default();
    assert_eq!(d.prepare.languages, vec![Language::Python]);
    let languages = |value: &str| {
        parse(&[("CORRAL_WORKER_PREPARE_LANGUAGES", value)])
            .prepare
            .languages
    };
    assert_eq!(languages("python"), vec![Language::Python]);
    assert_eq!(
        languages(" node , Python "),
        vec![Language::Node, Language::Python]
    );
    assert_eq!(languages("node,node"), vec![Language::Node]);
    // The aliases `run_code` accepts (decision 0026) mean the same here.
    assert_eq!(
        languages("py,JavaScript"),
        vec![Language::Python, Language::Node]
    );
    // Set but empty (or blank) is none; unset is the default.
    assert_eq!(languages(""), Vec::<Language>::new());
    assert_eq!(languages("  "), Vec::<Language>::new());
    assert_eq!(parse(&[]).prepare.languages, d.prepare.languages);
    for (bad, item) in [
        ("python,ruby", "ruby"),
        ("python,,node", ""),
        ("node,", ""),
        ("python2", "python2"),
    ] {
        let error = refuse(&[("CORRAL_WORKER_PREPARE_LANGUAGES", bad)]);
        assert_eq!(error.code(), "config_invalid_list_item", "{bad}");
        assert_eq!(error.setting(), "CORRAL_WORKER_PREPARE_LANGUAGES", "{bad}");
        let message = error.to_string();
        assert!(
            message.contains("CORRAL_WORKER_PREPARE_LANGUAGES")
                && message.contains(&format!("{item:?}")),
            "{message}"
        );
    }
}

#[test]
fn python_preimport_parse_fail_closed() {
    assert_eq!(
        Settings::default().prepare.python_preimport,
        ["numpy", "pandas", "matplotlib"]
    );
    let modules = |value: &str| {
        parse(&[("CORRAL_WORKER_PYTHON_PREIMPORT", value)])
            .prepare
            .python_preimport
    };
    assert_eq!(modules(""), Vec::<String>::new());
    assert_eq!(
        modules(" pandas, numpy ,os.path,_private.x1,numpy"),
        vec!["pandas", "numpy", "os.path", "_private.x1"]
    );
    let long = "m".repeat(PYTHON_MODULE_NAME_MAX_BYTES + 1);
    for bad in [
        "json,os;import x",
        "1abc",
        "a..b",
        ".json",
        "json.",
        "json,,os",
        "json,",
        "pan das",
        "__import__('os')",
        "naïve",
        "a-b",
        long.as_str(),
    ] {
        let error = refuse(&[("CORRAL_WORKER_PYTHON_PREIMPORT", bad)]);
        assert_eq!(error.code(), "config_invalid_list_item", "{bad}");
        assert_eq!(error.setting(), "CORRAL_WORKER_PYTHON_PREIMPORT", "{bad}");
        assert!(
            error.to_string().contains("CORRAL_WORKER_PYTHON_PREIMPORT"),
            "{error}"
        );
    }
    let most: Vec<String> = (0..PYTHON_PREIMPORT_MAX).map(|i| format!("m{i}")).collect();
    assert_eq!(modules(&most.join(",")), most);
    let too_many = format!("{},one_more", most.join(","));
    let error = refuse(&[("CORRAL_WORKER_PYTHON_PREIMPORT", too_many.as_str())]);
    assert_eq!(error.setting(), "CORRAL_WORKER_PYTHON_PREIMPORT");
    assert!(error.to_string().contains("one_more"), "{error}");
}

#[test]
fn prepare_settings_describe_and_read_back() {
    let s = parse(&[
        ("CORRAL_WORKER_PREPARE_LANGUAGES", "node"),
        ("CORRAL_WORKER_PYTHON_PREIMPORT", "json,os.path"),
    ]);
    let described = s.describe();
    let value = |name: &str| {
        described
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        value("CORRAL_WORKER_PREPARE_LANGUAGES").as_deref(),
        Some("node")
    );
    assert_eq!(
        value("CORRAL_WORKER_PYTHON_PREIMPORT").as_deref(),
        Some("json,os.path")
    );
    let none = parse(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "")]);
    let described = none.describe();
    let shown = described
        .iter()
        .find(|(n, _)| *n == "CORRAL_WORKER_PREPARE_LANGUAGES")
        .map(|(_, v)| v.as_str());
    assert_eq!(shown, Some(""));
    // What is described reads back as the same settings: empty stays "none".
    assert_eq!(parse(&[("CORRAL_WORKER_PREPARE_LANGUAGES", "")]), none);
}

#[test]
fn broker_url_must_be_http() {
    let s = parse(&[(
        "SANDBOX_PACKAGE_BROKER_URL",
        "http://corral-api:8000/broker",
    )]);
    assert_eq!(
        s.packages.broker_url.as_deref(),
        Some("http://corral-api:8000/broker")
    );
    for bad in [
        "corral-api:8000",
        "ftp://x",
        "http://",
        "http:///path",
        "https://a b",
    ] {
        let error = refuse(&[("SANDBOX_PACKAGE_BROKER_URL", bad)]);
        assert_eq!(error.code(), "config_invalid_url", "{bad}");
    }
}

#[test]
fn from_pairs_refuses_unknown_names() {
    let error = refuse(&[("SANDBOX_WARM_POOL_MINIMUM", "3")]);
    assert_eq!(error.code(), "config_unknown_setting");
    assert_eq!(error.setting(), "SANDBOX_WARM_POOL_MINIMUM");
}

#[test]
fn long_values_are_shortened_in_errors() {
    let long = "x".repeat(10_000);
    let error = refuse(&[("SANDBOX_MAX_PROCESSES", long.as_str())]);
    assert!(error.to_string().len() < 300, "{error}");
}

/// Independent of `validate`: every relation the specification and this module promise.
fn assert_every_relation(s: &Settings) {
    assert!(s.warm_pool_min <= s.pool_max_allocated);
    assert!(s.pool_target_idle <= s.pool_max_allocated);
    assert!(s.max_concurrent_creates <= s.pool_max_allocated);
    assert!(s.max_concurrent_per_member <= s.pool_max_allocated);
    assert!(s.lease_heartbeat_seconds < s.lease_ttl_seconds);
    assert!(s.bounds.max_output_bytes > 0 && s.bounds.max_artifact_bytes > 0);
    assert!(s.bounds.max_wall_seconds > 0 && s.bounds.dependency_install_timeout_seconds > 0);
    assert!(s.inventory_stale_seconds > 0);
    assert!(s.pool_max_allocated > 0 && s.max_concurrent_creates > 0);
    assert!(s.acquire_wait_seconds > 0 && s.acquire_queue_max > 0);
    assert!(s.bounds.dependency_install_timeout_seconds <= s.packages.token_ttl_seconds);
    assert!(s.worker.control_port != s.worker.browser_port);
    assert!(s.worker.control_port > 0 && s.worker.browser_port > 0);
    if s.pool_mode == PoolModeSetting::PlatformOperator {
        assert!(s.claim_lifetime_seconds > s.lease_heartbeat_seconds);
    }
    assert_eq!(s.validate(), Ok(()));
    let pool = s.pool();
    assert!(pool.lease_heartbeat_ms < pool.lease_ttl_ms);
    assert!(pool.inventory_stale_ms > 0);
}

/// One of `options`, chosen by weight. (`prop_oneof!` would do, but it expands to an `Arc`,
/// which this crate's lints forbid.)
fn one_of(options: Vec<(u32, BoxedStrategy<String>)>) -> BoxedStrategy<String> {
    prop::strategy::Union::new_weighted(options).boxed()
}

/// Values that hit both sides of the ranges and relations, and plain noise.
fn any_value() -> BoxedStrategy<String> {
    let suffixes = vec![
        "", " ", "B", "KiB", "mib", "GiB", "KB", "MB", "gb", "TB", "x",
    ];
    let words = vec![
        "true",
        "false",
        "on",
        "OFF",
        "yes",
        "maybe",
        "",
        "  ",
        "{}",
        "controller",
        "platform_operator",
        "http://api:8000",
        "-1",
        "1e3",
        "0x10",
        "٣",
    ];
    one_of(vec![
        (1, (0u64..80).prop_map(|n| n.to_string()).boxed()),
        (1, (0u64..2_000).prop_map(|n| n.to_string()).boxed()),
        (1, any::<u64>().prop_map(|n| n.to_string()).boxed()),
        (
            1,
            (0u64..5_000, prop::sample::select(suffixes))
                .prop_map(|(n, suffix)| format!("{n}{suffix}"))
                .boxed(),
        ),
        (
            1,
            prop::sample::select(words).prop_map(str::to_owned).boxed(),
        ),
        (1, any::<String>().boxed()),
    ])
}

/// The range of the numeric setting `name`, if it is one.
fn number_spec(name: &str) -> Option<Number> {
    Settings::default()
        .numbers()
        .into_iter()
        .map(|(spec, _)| *spec)
        .find(|spec| spec.name == name)
}

/// Mostly legal values, crowded at the low end where the relations between settings bite,
/// now and then a value just outside the range or plain noise.
fn plausible_value(name: &str) -> BoxedStrategy<String> {
    let words = |words: &[&'static str]| {
        one_of(vec![
            (
                12,
                prop::sample::select(words.to_vec())
                    .prop_map(str::to_owned)
                    .boxed(),
            ),
            (1, any_value()),
        ])
    };
    match name {
        "SANDBOX_WORKSPACE_PERSIST" => return words(&["true", "off", "YES", "0"]),
        "CORRAL_POOL_MODE" => {
            return words(&["controller", "platform_operator", "Platform_Operator"]);
        }
        "SANDBOX_PACKAGE_BROKER_URL" | "CORRAL_TOOL_ENDPOINT_URL" => {
            return words(&["http://api:8000", "https://u:p@api/broker"]);
        }
        "CORRAL_RESOURCE_AUTHORITY_URL" => {
            return words(&[
                "http://platform:9000",
                "sqlite:///var/lib/corral/resources.db",
            ]);
        }
        _ => {}
    }
    let Some(spec) = number_spec(name) else {
        return any_value();
    };
    let low_end = spec.max.min(spec.min + 100);
    one_of(vec![
        (24, (spec.min..=low_end).prop_map(|n| n.to_string()).boxed()),
        (6, (spec.min..=spec.max).prop_map(|n| n.to_string()).boxed()),
        (1, Just(spec.max.saturating_add(1).to_string()).boxed()),
        (1, Just(spec.min.saturating_sub(1).to_string()).boxed()),
        (1, any_value()),
    ])
}

fn lookup_in(values: &[Option<String>]) -> impl Fn(&str) -> Option<String> + '_ {
    |name| {
        let index = SETTINGS.iter().position(|doc| doc.name == name)?;
        values.get(index).cloned().flatten()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn from_lookup_never_panics_on_arbitrary_values(
        values in prop::collection::vec(prop::option::of(any_value()), SETTINGS.len()),
    ) {
        match Settings::from_lookup(lookup_in(&values)) {
            Ok(settings) => assert_every_relation(&settings),
            Err(error) => {
                let message = error.to_string();
                prop_assert!(message.contains(error.setting()), "{}", message);
                prop_assert!(error.code().starts_with("config_"));
                prop_assert!(setting_doc(error.setting()).is_some(), "{}", message);
            }
        }
    }
}

proptest! {
    // Most random combinations break a relation and are refused; they are rejected cases, and
    // the budget below still demands 500 accepted ones.
    #![proptest_config(ProptestConfig {
        cases: 500,
        max_global_rejects: 50_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn accepted_settings_satisfy_every_relation(
        values in SETTINGS
            .iter()
            .map(|doc| prop::option::weighted(0.25, plausible_value(doc.name)))
            .collect::<Vec<_>>(),
    ) {
        // Refused ones are rejected cases: a parser that refused everything would exhaust
        // proptest's rejection budget and fail.
        let parsed = Settings::from_lookup(lookup_in(&values));
        prop_assume!(parsed.is_ok());
        let settings = parsed.expect("assumed accepted");
        assert_every_relation(&settings);
        let described = settings.describe();
        // Every numeric setting is the value given, or its default when none was given, and
        // `describe` names it.
        let defaults = Settings::default().numbers();
        for ((spec, value), (_, default)) in settings.numbers().into_iter().zip(defaults) {
            let given = lookup_in(&values)(spec.name).filter(|v| !v.trim().is_empty());
            let expected = given.map_or(Ok(default), |given| Number::parse(spec, given.trim()));
            prop_assert_eq!(expected, Ok(value), "{}", spec.name);
            prop_assert!(described.iter().any(|(name, _)| *name == spec.name), "{}", spec.name);
        }
        // Egress values are kept, trimmed, whatever they are.
        let given = lookup_in(&values)("SANDBOX_EGRESS_MODE");
        let expected = given.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        prop_assert_eq!(settings.egress.mode, expected);
    }
}
