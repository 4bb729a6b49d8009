//! A streamed run's events (WS-7), kept deployment-wide so that a caller that lost its stream
//! resumes from any replica (`corral_core::run::progress`). One list per run: its owner (actor
//! and conversation) first, then event `n` at index `n`, each `{name, data}`. The replica that
//! runs the run is the only writer; an append names the number it expects, so that after a
//! failed append nothing later is kept out of order: the list stays a prefix of what was sent.
//! The list expires a while after its last event; what it may hold is bounded by the run's
//! output bound.

use corral_core::store::Unavailable;

use crate::ValkeyStore;

/// Starts a run's list with its owner: 1, or 0 when the run has one already. KEYS: the list.
/// ARGV: the owner, the keep in seconds.
const OPEN_SCRIPT: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
";

/// Appends event number ARGV[1] if it is the next: 1, else 0 (no list, or a gap). KEYS: the
/// list. ARGV: the number, the event, the keep in seconds.
const APPEND_SCRIPT: &str = r"
if redis.call('LLEN', KEYS[1]) ~= tonumber(ARGV[1]) then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
";

/// The owner, the number of events, and at most ARGV[2] events after number ARGV[1]; an empty
/// array when there is no list. KEYS: the list.
const READ_SCRIPT: &str = r"
local length = redis.call('LLEN', KEYS[1])
if length == 0 then return {} end
local first = tonumber(ARGV[1]) + 1
local reply = { redis.call('LINDEX', KEYS[1], 0), tostring(length - 1) }
if first <= length - 1 then
  local events = redis.call('LRANGE', KEYS[1], first, first + tonumber(ARGV[2]) - 1)
  for _, event in ipairs(events) do table.insert(reply, event) end
end
return reply
";

/// What a run's list holds from a point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunEvents {
    /// The owner, as opened.
    pub owner: String,
    /// How many events the run has had.
    pub published: u64,
    /// The events asked for, in order (each `{name, data}`).
    pub events: Vec<String>,
}

impl ValkeyStore {
    fn run_events_key(&self, run_id: &str) -> String {
        format!("{}:run-events:{run_id}", self.key)
    }

    /// Starts run `run_id`'s events with `owner`, kept `keep_seconds`: false when it has some.
    pub async fn open_run_events(
        &self,
        run_id: &str,
        owner: &str,
        keep_seconds: u64,
    ) -> Result<bool, Unavailable> {
        let opened = self
            .script_int(
                OPEN_SCRIPT,
                vec![self.run_events_key(run_id)],
                vec![owner.to_owned(), keep_seconds.to_string()],
            )
            .await?;
        Ok(opened == 1)
    }

    /// Appends run `run_id`'s event number `seq` (from 1), kept `keep_seconds` from now: false
    /// when it is not the next (an earlier append failed) or the run has no list.
    pub async fn append_run_event(
        &self,
        run_id: &str,
        seq: u64,
        event: &str,
        keep_seconds: u64,
    ) -> Result<bool, Unavailable> {
        let appended = self
            .script_int(
                APPEND_SCRIPT,
                vec![self.run_events_key(run_id)],
                vec![seq.to_string(), event.to_owned(), keep_seconds.to_string()],
            )
            .await?;
        Ok(appended == 1)
    }

    /// Run `run_id`'s owner, its number of events, and at most `max` events after number
    /// `after`; `None` when it has no list (never streamed, or expired).
    pub async fn run_events(
        &self,
        run_id: &str,
        after: u64,
        max: u64,
    ) -> Result<Option<RunEvents>, Unavailable> {
        let mut reply = self
            .link()
            .eval(
                READ_SCRIPT,
                vec![self.run_events_key(run_id)],
                vec![after.to_string(), max.to_string()],
            )
            .await
            .ok()
            .and_then(crate::Reply::texts)
            .ok_or(Unavailable)?;
        if reply.len() < 2 {
            return Ok(None);
        }
        let events = reply.split_off(2);
        let published = reply[1].parse().map_err(|_| Unavailable)?;
        Ok(Some(RunEvents {
            owner: std::mem::take(&mut reply[0]),
            published,
            events,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::valkey_server::ValkeyServer;

    #[tokio::test]
    async fn a_runs_events_are_kept_in_order_and_read_from_any_point() {
        let Some(server) =
            ValkeyServer::start_or_skip("a_runs_events_are_kept_in_order_and_read_from_any_point")
        else {
            return;
        };
        let store = ValkeyStore::connect(&server.url(), "events").await.unwrap();
        assert_eq!(store.run_events("r1", 0, 10).await.unwrap(), None);
        assert!(store.open_run_events("r1", "owner", 60).await.unwrap());
        assert!(!store.open_run_events("r1", "other", 60).await.unwrap());
        assert!(store.append_run_event("r1", 1, "e1", 60).await.unwrap());
        // Out of order (a gap after a failed append): refused, and nothing moves.
        assert!(!store.append_run_event("r1", 3, "e3", 60).await.unwrap());
        assert!(!store.append_run_event("r1", 1, "again", 60).await.unwrap());
        assert!(store.append_run_event("r1", 2, "e2", 60).await.unwrap());
        assert!(
            !store
                .append_run_event("r2", 1, "no list", 60)
                .await
                .unwrap()
        );
        let all = store.run_events("r1", 0, 10).await.unwrap().unwrap();
        assert_eq!(all.owner, "owner");
        assert_eq!(all.published, 2);
        assert_eq!(all.events, ["e1", "e2"]);
        let rest = store.run_events("r1", 1, 10).await.unwrap().unwrap();
        assert_eq!(rest.events, ["e2"]);
        let none = store.run_events("r1", 2, 10).await.unwrap().unwrap();
        assert!(none.events.is_empty());
        assert_eq!(
            store.run_events("r1", 0, 1).await.unwrap().unwrap().events,
            ["e1"]
        );
    }
}
