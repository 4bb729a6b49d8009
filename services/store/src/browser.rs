//! Browser sessions' records (BROW-14): each open session in one hash beside its pool's document,
//! so that any API replica can authorize and serve its calls, mark it private, reap it when idle
//! or close it. The replica that opened it holds (renews) its lease; whichever replica ends a
//! session announces how (reset or discard) on the pool's close channel, and the owner releases
//! the lease accordingly. A lost announcement is caught by the owner's own check of its sessions,
//! which releases a lease whose record is gone as a discard: no worker is reused on hope.
//!
//! What a call may do is corral-core's (`browser::judge_call`); this is storage only. Deployment
//! time is Valkey's clock, as for the pool.

use std::collections::BTreeMap;

use crate::{Heard, Subscription, ValkeyStore};
use corral_core::browser::{SessionRecord, SessionState};
use corral_core::pool::Disposition;
use corral_core::store::Unavailable;
use corral_core::time::UnixMillis;

/// A session's hash fields.
const RECORD: &str = "record";
/// See [`RECORD`].
const PRIVATE: &str = "private";
/// See [`RECORD`]: the member whose private interval it is (BROW-12), while there is one.
const PRIVATE_MEMBER: &str = "private_member";
/// See [`RECORD`].
const LAST_ACTIVITY: &str = "last_activity";
/// See [`RECORD`]: when a replica claimed the close.
const CLOSING: &str = "closing";

/// Writes a new session and lists it. KEYS: the session's hash, the set of sessions. ARGV: id,
/// record, last activity.
const PUT_SCRIPT: &str = r"
redis.call('HSET', KEYS[1], 'record', ARGV[2], 'private', '0', 'last_activity', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
";

/// Sets one field of a live session (not closing): 1 when set, 0 when there is no such session or
/// it is closing. KEYS: the session's hash. ARGV: field, value.
const SET_LIVE_SCRIPT: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'closing') == 1 then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
";

/// Starts or ends a live session's private interval: 1 when set, 0 when there is no such session
/// or it is closing. KEYS: the session's hash. ARGV: '1' or '0', the member (empty: none).
const SET_PRIVATE_SCRIPT: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'closing') == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'private', ARGV[1])
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], 'private_member')
else
  redis.call('HSET', KEYS[1], 'private_member', ARGV[2])
end
return 1
";
/// Claims the close: 1 for the first claim of an existing session, else 0. KEYS: the session's
/// hash. ARGV: when (deployment milliseconds).
const CLAIM_SCRIPT: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('HSETNX', KEYS[1], 'closing', ARGV[1])
";

/// Forgets a session, keeps how it ended for [`ENDED_KEEP_SECONDS`] and announces it. KEYS: the
/// session's hash, the set, the channel, the ended key. ARGV: id, the announcement, the keep.
const END_SCRIPT: &str = r"
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('SET', KEYS[4], ARGV[2], 'EX', ARGV[3])
redis.call('PUBLISH', KEYS[3], ARGV[2])
return 1
";

/// How long how a session ended stays readable, for an owner that missed the announcement.
pub const ENDED_KEEP_SECONDS: u64 = 3_600;

/// The ids of every open session. KEYS: the set.
const LIST_SCRIPT: &str = r"
return redis.call('SMEMBERS', KEYS[1])
";

/// How a session ended, as announced: `<id> reset` or `<id> discard`.
fn announcement(id: &str, disposition: Disposition) -> String {
    let how = match disposition {
        Disposition::Reset => "reset",
        Disposition::Discard => "discard",
    };
    format!("{id} {how}")
}

/// The announcement's session and disposition; `None` for anything else.
fn parse_announcement(text: &str) -> Option<(String, Disposition)> {
    let (id, how) = text.split_once(' ')?;
    let disposition = match how {
        "reset" => Disposition::Reset,
        "discard" => Disposition::Discard,
        _ => return None,
    };
    Some((id.to_owned(), disposition))
}

impl ValkeyStore {
    fn browser_key(&self, id: &str) -> String {
        format!("{}:browser:{id}", self.key)
    }

    fn browser_set(&self) -> String {
        format!("{}:browser", self.key)
    }

    fn browser_ended_key(&self, id: &str) -> String {
        format!("{}:browser-ended:{id}", self.key)
    }

    fn browser_channel(&self) -> String {
        format!("{}:browser:ended", self.key)
    }

    /// Stores a new session `id`, last active at `now`.
    pub async fn put_browser_session(
        &self,
        id: &str,
        record: &SessionRecord,
        now: UnixMillis,
    ) -> Result<(), Unavailable> {
        let record = serde_json::to_string(record).map_err(|_| Unavailable)?;
        self.script_int(
            PUT_SCRIPT,
            vec![self.browser_key(id), self.browser_set()],
            vec![id.to_owned(), record, now.0.to_string()],
        )
        .await
        .map(|_| ())
    }

    /// The session `id`; `None` when there is none.
    pub async fn browser_session(
        &self,
        id: &str,
    ) -> Result<Option<(SessionRecord, SessionState)>, Unavailable> {
        Ok(self
            .browser_session_viewed(id)
            .await?
            .map(|(record, state, _)| (record, state)))
    }

    /// Every open session of the pool, by id.
    pub async fn browser_sessions(
        &self,
    ) -> Result<Vec<(String, SessionRecord, SessionState)>, Unavailable> {
        let ids = self
            .link()
            .eval(LIST_SCRIPT, vec![self.browser_set()], Vec::new())
            .await
            .ok()
            .and_then(crate::Reply::texts)
            .ok_or(Unavailable)?;
        let mut sessions = Vec::with_capacity(ids.len());
        for id in ids {
            // Ended between the listing and the read: gone, not an error.
            if let Some((record, state)) = self.browser_session(&id).await? {
                sessions.push((id, record, state));
            }
        }
        Ok(sessions)
    }

    /// Records a call reaching session `id` at `now`; false when it is gone or closing.
    pub async fn touch_browser_session(
        &self,
        id: &str,
        now: UnixMillis,
    ) -> Result<bool, Unavailable> {
        self.script_int(
            SET_LIVE_SCRIPT,
            vec![self.browser_key(id)],
            vec![LAST_ACTIVITY.to_owned(), now.0.to_string()],
        )
        .await
        .map(|set| set == 1)
    }

    /// Marks session `id` private for `member` or, with `None`, ends the interval (BROW-12); false
    /// when it is gone or closing.
    pub async fn mark_browser_session_private(
        &self,
        id: &str,
        member: Option<&str>,
    ) -> Result<bool, Unavailable> {
        self.script_int(
            SET_PRIVATE_SCRIPT,
            vec![self.browser_key(id)],
            vec![
                if member.is_some() { "1" } else { "0" }.to_owned(),
                member.unwrap_or_default().to_owned(),
            ],
        )
        .await
        .map(|set| set == 1)
    }

    /// Replaces live session `id`'s record (its renewed TURN credential, BROW-9); false when it is
    /// gone or closing.
    pub async fn replace_browser_record(
        &self,
        id: &str,
        record: &SessionRecord,
    ) -> Result<bool, Unavailable> {
        let record = serde_json::to_string(record).map_err(|_| Unavailable)?;
        self.script_int(
            SET_LIVE_SCRIPT,
            vec![self.browser_key(id)],
            vec![RECORD.to_owned(), record],
        )
        .await
        .map(|set| set == 1)
    }

    /// Session `id` with the member whose private interval it is, if any: what a viewer is
    /// judged by (BROW-12); one read of the session's hash.
    pub async fn browser_session_viewed(
        &self,
        id: &str,
    ) -> Result<Option<(SessionRecord, SessionState, Option<String>)>, Unavailable> {
        let hash: BTreeMap<String, String> = self
            .link()
            .command(vec!["HGETALL".to_owned(), self.browser_key(id)])
            .await
            .ok()
            .and_then(crate::Reply::pairs)
            .ok_or(Unavailable)?;
        if hash.is_empty() {
            return Ok(None);
        }
        let record = hash
            .get(RECORD)
            .and_then(|r| serde_json::from_str(r).ok())
            .ok_or(Unavailable)?;
        let last_activity = hash
            .get(LAST_ACTIVITY)
            .and_then(|t| t.parse().ok())
            .map(UnixMillis)
            .ok_or(Unavailable)?;
        let state = SessionState {
            private: hash.get(PRIVATE).is_some_and(|p| p == "1"),
            last_activity,
            closing: match hash.get(CLOSING) {
                Some(since) => Some(UnixMillis(since.parse().map_err(|_| Unavailable)?)),
                None => None,
            },
        };
        let member = hash.get(PRIVATE_MEMBER).filter(|m| !m.is_empty()).cloned();
        Ok(Some((record, state, member)))
    }

    /// Claims the close of session `id` at `now`: true for exactly one claimant.
    pub async fn claim_browser_close(
        &self,
        id: &str,
        now: UnixMillis,
    ) -> Result<bool, Unavailable> {
        self.script_int(
            CLAIM_SCRIPT,
            vec![self.browser_key(id)],
            vec![now.0.to_string()],
        )
        .await
        .map(|claimed| claimed == 1)
    }

    /// Forgets session `id` and announces that its lease ends as `disposition`.
    pub async fn end_browser_session(
        &self,
        id: &str,
        disposition: Disposition,
    ) -> Result<(), Unavailable> {
        self.script_int(
            END_SCRIPT,
            vec![
                self.browser_key(id),
                self.browser_set(),
                self.browser_channel(),
                self.browser_ended_key(id),
            ],
            vec![
                id.to_owned(),
                announcement(id, disposition),
                ENDED_KEEP_SECONDS.to_string(),
            ],
        )
        .await
        .map(|_| ())
    }

    /// How session `id` ended, if it ended within [`ENDED_KEEP_SECONDS`].
    pub async fn browser_session_ended(
        &self,
        id: &str,
    ) -> Result<Option<Disposition>, Unavailable> {
        let text = self
            .link()
            .command(vec!["GET".to_owned(), self.browser_ended_key(id)])
            .await
            .map_err(|_| Unavailable)?
            .text();
        Ok(text
            .as_deref()
            .and_then(parse_announcement)
            .filter(|(ended, _)| ended == id)
            .map(|(_, disposition)| disposition))
    }

    /// A subscription to sessions' ends, for the replicas that hold their leases.
    pub async fn watch_browser_ends(&self) -> Result<EndWatch, Unavailable> {
        let subscription = self
            .link()
            .subscribe(self.browser_channel())
            .await
            .map_err(|_| Unavailable)?;
        Ok(EndWatch { subscription })
    }
}

/// Announcements of sessions' ends.
pub struct EndWatch {
    subscription: Subscription,
}

/// What [`EndWatch::next`] saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Session `.0` ended as `.1`.
    Session(String, Disposition),
    /// Announcements were missed: the holder checks its sessions itself.
    Missed,
    /// The subscription is gone.
    Closed,
}

impl EndWatch {
    /// The next announcement.
    pub async fn next(&mut self) -> Ended {
        loop {
            match self.subscription.next().await {
                Heard::Message(text) => {
                    if let Some((id, disposition)) = parse_announcement(&text) {
                        return Ended::Session(id, disposition);
                    }
                }
                Heard::Missed => return Ended::Missed,
                Heard::Closed => return Ended::Closed,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announcement_reads_back_as_written_and_nothing_else_reads() {
        for disposition in [Disposition::Reset, Disposition::Discard] {
            assert_eq!(
                parse_announcement(&announcement("abc", disposition)),
                Some(("abc".to_owned(), disposition))
            );
        }
        for garbage in ["", "abc", "abc keep", "abc reset extra"] {
            assert_eq!(parse_announcement(garbage), None, "{garbage:?}");
        }
    }
}
