//! The store's one seam to Valkey (issue 28, decision 0051).
//!
//! Everything the store says to Valkey goes through a [`Link`]: a script run with its keys and
//! arguments, a plain command, and a subscription to a channel. In production the link is
//! [`FredLink`] (fred's client on tokio's sockets); the shell world under simulation
//! (`corral-sim-shells`) gives the store a link of its own over turmoil's network to a simulated
//! Valkey host that runs these same scripts, so that an outage or a partition is real message loss
//! and delay. Only the wire differs: what the store sends and how it reads each reply is the same
//! code in both.
//!
//! The link is also the store's source of entropy (new epochs, backoff jitter), so that a
//! simulated world is the product of its seed alone.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use fred::prelude::*;
use fred::types::scripts::Script;

/// A reply in the store's own terms (RESP's shapes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// No value.
    Nil,
    /// An integer.
    Int(i64),
    /// A string (UTF-8; every value Corral stores is text).
    Text(String),
    /// An array.
    List(Vec<Reply>),
}

impl Reply {
    /// The reply as an integer, when it is one (or a string that reads as one).
    #[must_use]
    pub fn int(&self) -> Option<i64> {
        match self {
            Self::Int(n) => Some(*n),
            Self::Text(text) => text.parse().ok(),
            Self::Nil | Self::List(_) => None,
        }
    }

    /// The reply as text; `None` for nil or an array.
    #[must_use]
    pub fn text(self) -> Option<String> {
        match self {
            Self::Text(text) => Some(text),
            Self::Int(n) => Some(n.to_string()),
            Self::Nil | Self::List(_) => None,
        }
    }

    /// The reply's elements; nil is empty, a scalar is itself alone.
    #[must_use]
    pub fn list(self) -> Vec<Reply> {
        match self {
            Self::List(items) => items,
            Self::Nil => Vec::new(),
            scalar => vec![scalar],
        }
    }

    /// An array of strings; `None` when an element is not one.
    #[must_use]
    pub fn texts(self) -> Option<Vec<String>> {
        self.list().into_iter().map(Reply::text).collect()
    }

    /// An array of alternating fields and values (`HGETALL`) as a map; `None` when it is not.
    #[must_use]
    pub fn pairs(self) -> Option<BTreeMap<String, String>> {
        let items = self.texts()?;
        if items.len() % 2 != 0 {
            return None;
        }
        let mut items = items.into_iter();
        let mut map = BTreeMap::new();
        while let (Some(field), Some(value)) = (items.next(), items.next()) {
            map.insert(field, value);
        }
        Some(map)
    }
}

/// The command failed, or its answer was lost: it may or may not have been applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lost;

/// A call in flight on a link.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = Result<T, Lost>> + Send + 'a>>;

/// What a subscription heard next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Heard {
    /// A message published on the channel.
    Message(String),
    /// Messages were missed (the subscriber fell behind or reconnected).
    Missed,
    /// The subscription is gone.
    Closed,
}

/// The messages of one subscription, in order.
pub trait Messages: Send {
    /// The next thing heard.
    fn next(&mut self) -> Pin<Box<dyn Future<Output = Heard> + Send + '_>>;
}

/// A subscription to one channel.
pub struct Subscription(Box<dyn Messages>);

impl Subscription {
    /// A subscription that hears what `messages` hears.
    #[must_use]
    pub fn new(messages: Box<dyn Messages>) -> Self {
        Self(messages)
    }

    /// The next thing heard.
    pub async fn next(&mut self) -> Heard {
        self.0.next().await
    }
}

/// The store's connection to Valkey.
pub trait Link: Send + Sync {
    /// Runs the Lua `script` with `keys` and `args`.
    fn eval<'a>(
        &'a self,
        script: &'static str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Pending<'a, Reply>;

    /// Sends one plain command (`TIME`, `HGETALL key`, `GET key`, `DEL key`).
    fn command<'a>(&'a self, args: Vec<String>) -> Pending<'a, Reply>;

    /// Subscribes to `channel` on a connection of its own.
    fn subscribe<'a>(&'a self, channel: String) -> Pending<'a, Subscription>;

    /// False when the link knows it is cut off (a write is then not even tried).
    fn connected(&self) -> bool {
        true
    }

    /// Sixty-four bits nobody can predict in production: new epochs and backoff jitter. A
    /// simulated link draws them from its world's seed.
    fn entropy(&self) -> u64 {
        crate::fresh_epoch()
    }
}

/// The production link: fred's client on tokio's sockets.
pub struct FredLink {
    client: Client,
    /// Each script as fred sends it (its SHA-1 computed once), by the address of its source: the
    /// store's scripts are constants, so a hot path never hashes one again.
    scripts: std::sync::Mutex<std::collections::HashMap<usize, Script>>,
}

impl FredLink {
    /// A link over `client`, already initialised.
    #[must_use]
    pub fn new(client: Client) -> Self {
        Self {
            client,
            scripts: std::sync::Mutex::default(),
        }
    }

    /// `source` as fred sends it.
    fn script(&self, source: &'static str) -> Script {
        self.scripts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(source.as_ptr() as usize)
            .or_insert_with(|| Script::from_lua(source))
            .clone()
    }
}

/// A fred value in the store's terms.
fn reply_of(value: Value) -> Reply {
    match value {
        Value::Null => Reply::Nil,
        Value::Integer(n) => Reply::Int(n),
        Value::Boolean(b) => Reply::Int(i64::from(b)),
        Value::Array(items) => Reply::List(items.into_iter().map(reply_of).collect()),
        Value::Map(map) => Reply::List(
            map.inner()
                .into_iter()
                .flat_map(|(key, value)| {
                    [
                        key.as_str()
                            .map_or(Reply::Nil, |k| Reply::Text(k.to_string())),
                        reply_of(value),
                    ]
                })
                .collect(),
        ),
        other => other.into_string().map_or(Reply::Nil, Reply::Text),
    }
}

impl Link for FredLink {
    fn eval<'a>(
        &'a self,
        script: &'static str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Pending<'a, Reply> {
        let script = self.script(script);
        Box::pin(async move {
            script
                .evalsha_with_reload::<Value, _, _>(&self.client, keys, args)
                .await
                .map(reply_of)
                .map_err(|_| Lost)
        })
    }

    fn command<'a>(&'a self, args: Vec<String>) -> Pending<'a, Reply> {
        Box::pin(async move {
            let Some((name, rest)) = args.split_first() else {
                return Err(Lost);
            };
            let command = fred::types::CustomCommand::new(
                name.clone(),
                fred::types::ClusterHash::FirstKey,
                false,
            );
            self.client
                .custom::<Value, _>(command, rest.to_vec())
                .await
                .map(reply_of)
                .map_err(|_| Lost)
        })
    }

    fn subscribe<'a>(&'a self, channel: String) -> Pending<'a, Subscription> {
        Box::pin(async move {
            let subscriber = self.client.clone_new();
            // Closed with the subscription, or now if it cannot be had (see `FredMessages`).
            let subscriber = FredMessages {
                messages: subscriber.message_rx(),
                subscriber,
            };
            subscriber.subscriber.init().await.map_err(|_| Lost)?;
            subscriber
                .subscriber
                .subscribe(channel)
                .await
                .map_err(|_| Lost)?;
            Ok(Subscription::new(Box::new(subscriber)))
        })
    }

    fn connected(&self) -> bool {
        self.client.is_connected()
    }
}

/// A fred subscriber and what it hears. Its connection is closed when it is dropped: a fred
/// client's connection outlives every handle to it until it is told to quit, so each dropped
/// subscription left a connection subscribed to the pool's channel, to which Valkey sent every
/// announcement afterwards (99 of them after one burst of 100 queued runs, each pool write then
/// published to all; issue 29).
struct FredMessages {
    subscriber: Client,
    messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
}

impl Drop for FredMessages {
    fn drop(&mut self) {
        let subscriber = self.subscriber.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = subscriber.quit().await;
            });
        }
    }
}

impl Messages for FredMessages {
    fn next(&mut self) -> Pin<Box<dyn Future<Output = Heard> + Send + '_>> {
        Box::pin(async move {
            match self.messages.recv().await {
                // A message that is not text is still news (a version watch wakes on it).
                Ok(message) => Heard::Message(message.value.as_string().unwrap_or_default()),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Heard::Missed,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => Heard::Closed,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_reads_as_the_store_expects_and_a_malformed_one_is_refused() {
        let hash = Reply::List(vec![
            Reply::Text("version".into()),
            Reply::Int(3),
            Reply::Text("doc".into()),
            Reply::Text("{}".into()),
        ]);
        let map = hash.pairs().expect("pairs");
        assert_eq!(map.get("version").map(String::as_str), Some("3"));
        assert_eq!(map.len(), 2);
        assert_eq!(Reply::List(vec![Reply::Text("odd".into())]).pairs(), None);
        assert_eq!(
            Reply::List(vec![Reply::Nil, Reply::Text("x".into())]).texts(),
            None
        );
        assert_eq!(Reply::Text("42".into()).int(), Some(42));
        assert_eq!(Reply::Nil.text(), None);
        assert_eq!(Reply::Nil.list(), Vec::new());
    }
}
