//! The deployment's egress policy as the administrator set it (EGR-5, EGR-9): raw setting values in
//! one Valkey hash with a revision that every change bumps and every grant carries. The API reads
//! it at each dispatch, so a change applies to the next run with no restart. What the values mean,
//! and what is enforceable, is corral-core's (`egress::mode::resolve`); this is storage only.

use std::collections::BTreeMap;

use corral_core::store::Unavailable;

use crate::ValkeyStore;

/// The hash holding the policy; deployment-wide, not per pool.
pub const POLICY_KEY: &str = "corral:egress-policy";

/// The fields a policy may hold: the egress settings an administrator may change at run time.
pub const POLICY_FIELDS: [&str; 6] = [
    "SANDBOX_EGRESS_ENABLED",
    "SANDBOX_EGRESS_MODE",
    "SANDBOX_EGRESS_ALLOWED_PORTS",
    "SANDBOX_EGRESS_PRIVATE_CIDRS",
    "SANDBOX_EGRESS_ALLOWED_HOSTS",
    "SANDBOX_EGRESS_TOKEN_TTL_SECONDS",
];

/// Replace every field and bump the revision, atomically. ARGV: the number n of field names to
/// clear, those n names, then name, value pairs to set.
const REPLACE_SCRIPT: &str = r"
local revision = redis.call('HINCRBY', KEYS[1], 'revision', 1)
local n = tonumber(ARGV[1])
for i = 2, n + 1 do redis.call('HDEL', KEYS[1], ARGV[i]) end
for i = n + 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return revision
";

/// The stored policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredPolicy {
    /// Bumped by every change; grants carry it.
    pub revision: u64,
    /// Setting name to raw value; an absent field is an absent setting.
    pub fields: BTreeMap<String, String>,
}

impl ValkeyStore {
    /// The stored policy; `None` when no administrator has set one.
    pub async fn egress_policy(&self) -> Result<Option<StoredPolicy>, Unavailable> {
        let hash: BTreeMap<String, String> = self
            .link()
            .command(vec!["HGETALL".to_owned(), POLICY_KEY.to_owned()])
            .await
            .ok()
            .and_then(crate::Reply::pairs)
            .ok_or(Unavailable)?;
        if hash.is_empty() {
            return Ok(None);
        }
        let revision = hash
            .get("revision")
            .and_then(|r| r.parse().ok())
            .ok_or(Unavailable)?;
        let fields = hash
            .into_iter()
            .filter(|(name, _)| POLICY_FIELDS.contains(&name.as_str()))
            .collect();
        Ok(Some(StoredPolicy { revision, fields }))
    }

    /// Replaces the policy with `fields` (names from [`POLICY_FIELDS`]; others are ignored) and
    /// returns the new revision.
    pub async fn replace_egress_policy(
        &self,
        fields: &BTreeMap<String, String>,
    ) -> Result<u64, Unavailable> {
        let keys = vec![POLICY_KEY.to_owned()];
        let mut args = vec![POLICY_FIELDS.len().to_string()];
        args.extend(POLICY_FIELDS.iter().map(|f| (*f).to_owned()));
        args.extend(
            fields
                .iter()
                .filter(|(name, _)| POLICY_FIELDS.contains(&name.as_str()))
                .flat_map(|(name, value)| [name.clone(), value.clone()]),
        );
        let revision = self.script_int(REPLACE_SCRIPT, keys, args).await?;
        u64::try_from(revision).map_err(|_| Unavailable)
    }
}
