//! A simulated Valkey host, and the store's link to it over turmoil's network (decision 0051).
//!
//! The host keeps the data types Corral's store uses (strings with expiry, hashes, sets, lists) and
//! runs the store's own Lua scripts with a real Lua interpreter: `redis.call` answers the commands
//! those scripts call, `TIME` is the world's clock, and `INFO server` names a run id that is new
//! at every start, as Valkey's is. Its data lives outside the host, so a crash can restart it empty
//! or from its last state.
//!
//! The wire is one JSON line per request and per answer on a TCP connection of turmoil's: a
//! script (`{"eval": [script, keys, args]}`), a command (`{"command": args}`) or a subscription
//! (`{"subscribe": channel}`, then one line per message). The store's side
//! ([`TurmoilLink`]) opens a connection per call and gives up after the store's command timeout,
//! so a partition, a held message or a crashed host is an answer that never comes: `Lost`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use corral_store::link::{Heard, Link, Lost, Messages, Pending, Reply, Subscription};
use mlua::{Lua, Value as Lua_};
use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::dns::Dns;

/// The port the simulated Valkey listens on.
pub const PORT: u16 = 6379;

/// The wall clock the world starts at (deployment time, in ms).
pub const WORLD_EPOCH_MS: u64 = 1_800_000_000_000;

/// How long a call may take before the store gives up on it (the production store's timeout).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One stored value.
#[derive(Clone, Debug)]
enum Entry {
    Text(String),
    Hash(BTreeMap<String, String>),
    Set(BTreeSet<String>),
    List(Vec<String>),
}

/// Valkey's keyspace; it outlives a crash of its host unless the world empties it.
#[derive(Default)]
pub struct Data {
    entries: BTreeMap<String, Entry>,
    /// When a key expires, in deployment ms.
    expiry: BTreeMap<String, u64>,
}

impl Data {
    /// Forgets everything (a restart without persistence).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// The hash at `key`, if there is one.
    pub fn hash(&self, key: &str) -> Option<&BTreeMap<String, String>> {
        match self.entries.get(key) {
            Some(Entry::Hash(hash)) => Some(hash),
            _ => None,
        }
    }

    fn expire_due(&mut self, now: u64) {
        let due: Vec<String> = self
            .expiry
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        for key in due {
            self.expiry.remove(&key);
            self.entries.remove(&key);
        }
    }

    fn remove(&mut self, key: &str) -> bool {
        self.expiry.remove(key);
        self.entries.remove(key).is_some()
    }
}

/// The world's deployment clock: its epoch plus simulated time.
pub fn deployment_ms() -> u64 {
    WORLD_EPOCH_MS
        + u64::try_from(turmoil::sim_elapsed().unwrap_or_default().as_millis()).unwrap_or(0)
}

/// What the world watches of its Valkey: every write of a hash field, as it lands.
pub type Observer = Arc<dyn Fn(&Data, &str) + Send + Sync>;

/// A running Valkey: its data, its run id, its subscribers and its interpreter.
struct Server {
    data: Arc<Mutex<Data>>,
    run_id: String,
    subscribers: Mutex<BTreeMap<String, Vec<tokio::sync::mpsc::UnboundedSender<String>>>>,
    observer: Observer,
}

/// The answer of one command, or why it failed.
type Answered = Result<Reply, String>;

fn text_arg(args: &[String], at: usize) -> Result<&str, String> {
    args.get(at)
        .map(String::as_str)
        .ok_or_else(|| "wrong number of arguments".to_owned())
}

impl Server {
    /// One command, applied to the data.
    fn command(&self, args: &[String]) -> Answered {
        let name = text_arg(args, 0)?.to_ascii_uppercase();
        let now = deployment_ms();
        let written = {
            let mut data = lock(&self.data);
            data.expire_due(now);
            let reply = apply(&mut data, &name, args, now, &self.run_id)?;
            if let Some(key) = writes_hash(&name, args) {
                (self.observer)(&data, key);
            }
            reply
        };
        if name == "PUBLISH" {
            let (channel, message) = (text_arg(args, 1)?, text_arg(args, 2)?);
            let mut subscribers = lock(&self.subscribers);
            let list = subscribers.entry(channel.to_owned()).or_default();
            list.retain(|s| s.send(message.to_owned()).is_ok());
            return Ok(Reply::Int(i64::try_from(list.len()).unwrap_or(0)));
        }
        Ok(written)
    }
}

/// The hash a command writes, for the observer.
fn writes_hash<'a>(name: &str, args: &'a [String]) -> Option<&'a str> {
    matches!(name, "HSET" | "HSETNX" | "HDEL" | "HINCRBY" | "DEL")
        .then(|| args.get(1).map(String::as_str))
        .flatten()
}

fn hash_of<'a>(data: &'a mut Data, key: &str) -> Result<&'a mut BTreeMap<String, String>, String> {
    match data
        .entries
        .entry(key.to_owned())
        .or_insert_with(|| Entry::Hash(BTreeMap::new()))
    {
        Entry::Hash(hash) => Ok(hash),
        _ => Err("WRONGTYPE".to_owned()),
    }
}

fn count(n: usize) -> Reply {
    Reply::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

/// Applies one command (everything but `PUBLISH`'s delivery) to `data` at deployment time `now`.
fn apply(data: &mut Data, name: &str, args: &[String], now: u64, run_id: &str) -> Answered {
    let key = || text_arg(args, 1);
    Ok(match name {
        "TIME" => Reply::List(vec![
            Reply::Text((now / 1_000).to_string()),
            Reply::Text(((now % 1_000) * 1_000).to_string()),
        ]),
        "INFO" => Reply::Text(format!("# Server\r\nrun_id:{run_id}\r\n")),
        "EXISTS" => count(usize::from(data.entries.contains_key(key()?))),
        "DEL" => count(usize::from(data.remove(key()?))),
        "EXPIRE" => {
            let seconds: u64 = text_arg(args, 2)?.parse().map_err(|_| "not an integer")?;
            if data.entries.contains_key(key()?) {
                data.expiry.insert(key()?.to_owned(), now + seconds * 1_000);
                count(1)
            } else {
                count(0)
            }
        }
        "GET" => match data.entries.get(key()?) {
            Some(Entry::Text(text)) => Reply::Text(text.clone()),
            None => Reply::Nil,
            Some(_) => return Err("WRONGTYPE".to_owned()),
        },
        "SET" => {
            let key = key()?.to_owned();
            data.remove(&key);
            data.entries
                .insert(key.clone(), Entry::Text(text_arg(args, 2)?.to_owned()));
            if args.get(3).is_some_and(|a| a.eq_ignore_ascii_case("EX")) {
                let seconds: u64 = text_arg(args, 4)?.parse().map_err(|_| "not an integer")?;
                data.expiry.insert(key, now + seconds * 1_000);
            }
            Reply::Text("OK".to_owned())
        }
        "HSET" => {
            let hash = hash_of(data, key()?)?;
            let mut added = 0;
            for pair in args[2..].chunks(2) {
                let [field, value] = pair else {
                    return Err("wrong number of arguments".to_owned());
                };
                added += usize::from(hash.insert(field.clone(), value.clone()).is_none());
            }
            count(added)
        }
        "HSETNX" => {
            let (field, value) = (text_arg(args, 2)?, text_arg(args, 3)?);
            let hash = hash_of(data, key()?)?;
            if hash.contains_key(field) {
                count(0)
            } else {
                hash.insert(field.to_owned(), value.to_owned());
                count(1)
            }
        }
        "HINCRBY" => {
            let by: i64 = text_arg(args, 3)?.parse().map_err(|_| "not an integer")?;
            let field = text_arg(args, 2)?.to_owned();
            let hash = hash_of(data, key()?)?;
            let value = hash
                .get(&field)
                .map_or(Ok(0), |v| v.parse::<i64>())
                .map_err(|_| "not an integer")?
                + by;
            hash.insert(field, value.to_string());
            Reply::Int(value)
        }
        "HDEL" => {
            let key = key()?.to_owned();
            let hash = hash_of(data, &key)?;
            let removed = args[2..]
                .iter()
                .filter(|f| hash.remove(*f).is_some())
                .count();
            if hash.is_empty() {
                data.remove(&key);
            }
            count(removed)
        }
        "HGET" | "HEXISTS" | "HMGET" | "HGETALL" => {
            let empty = BTreeMap::new();
            let hash = match data.entries.get(key()?) {
                Some(Entry::Hash(hash)) => hash,
                None => &empty,
                Some(_) => return Err("WRONGTYPE".to_owned()),
            };
            let field = |f: &String| hash.get(f).map_or(Reply::Nil, |v| Reply::Text(v.clone()));
            match name {
                "HGET" => field(&text_arg(args, 2)?.to_owned()),
                "HEXISTS" => count(usize::from(hash.contains_key(text_arg(args, 2)?))),
                "HMGET" => Reply::List(args[2..].iter().map(field).collect()),
                _ => Reply::List(
                    hash.iter()
                        .flat_map(|(f, v)| [Reply::Text(f.clone()), Reply::Text(v.clone())])
                        .collect(),
                ),
            }
        }
        "SADD" | "SREM" => {
            let key = key()?.to_owned();
            let Entry::Set(set) = data
                .entries
                .entry(key.clone())
                .or_insert_with(|| Entry::Set(BTreeSet::new()))
            else {
                return Err("WRONGTYPE".to_owned());
            };
            let changed = args[2..]
                .iter()
                .filter(|m| {
                    if name == "SADD" {
                        set.insert((*m).clone())
                    } else {
                        set.remove(*m)
                    }
                })
                .count();
            if set.is_empty() {
                data.remove(&key);
            }
            count(changed)
        }
        "SMEMBERS" => match data.entries.get(key()?) {
            Some(Entry::Set(set)) => Reply::List(set.iter().cloned().map(Reply::Text).collect()),
            None => Reply::List(Vec::new()),
            Some(_) => return Err("WRONGTYPE".to_owned()),
        },
        "RPUSH" => {
            let Entry::List(list) = data
                .entries
                .entry(key()?.to_owned())
                .or_insert_with(|| Entry::List(Vec::new()))
            else {
                return Err("WRONGTYPE".to_owned());
            };
            list.extend(args[2..].iter().cloned());
            count(list.len())
        }
        "LLEN" | "LINDEX" | "LRANGE" => {
            let list = match data.entries.get(key()?) {
                Some(Entry::List(list)) => list.as_slice(),
                None => &[],
                Some(_) => return Err("WRONGTYPE".to_owned()),
            };
            let index = |at: usize| -> Result<usize, String> {
                let i: i64 = text_arg(args, at)?.parse().map_err(|_| "not an integer")?;
                let len = i64::try_from(list.len()).unwrap_or(i64::MAX);
                Ok(usize::try_from(if i < 0 { len + i } else { i }.max(0)).unwrap_or(0))
            };
            match name {
                "LLEN" => count(list.len()),
                "LINDEX" => list
                    .get(index(2)?)
                    .map_or(Reply::Nil, |v| Reply::Text(v.clone())),
                _ => {
                    let (from, to) = (index(2)?, index(3)?);
                    Reply::List(
                        list.iter()
                            .skip(from)
                            .take((to + 1).saturating_sub(from))
                            .cloned()
                            .map(Reply::Text)
                            .collect(),
                    )
                }
            }
        }
        "PUBLISH" => Reply::Int(0),
        other => return Err(format!("unknown command {other}")),
    })
}

/// A Lua value as a command argument.
fn argument(value: &Lua_) -> mlua::Result<String> {
    match value {
        Lua_::String(s) => Ok(s.to_str()?.to_string()),
        Lua_::Integer(n) => Ok(n.to_string()),
        Lua_::Number(n) => Ok(if n.fract() == 0.0 {
            format!("{}", *n as i64)
        } else {
            n.to_string()
        }),
        other => Err(mlua::Error::runtime(format!(
            "argument of type {} to redis.call",
            other.type_name()
        ))),
    }
}

/// A reply as `redis.call` gives it to a script.
fn to_lua(lua: &Lua, reply: Reply) -> mlua::Result<Lua_> {
    Ok(match reply {
        Reply::Nil => Lua_::Boolean(false),
        Reply::Int(n) => Lua_::Integer(n),
        Reply::Text(text) => Lua_::String(lua.create_string(&text)?),
        Reply::List(items) => {
            let table = lua.create_table()?;
            for (i, item) in items.into_iter().enumerate() {
                table.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Lua_::Table(table)
        }
    })
}

/// A script's return value as Valkey replies it (a table is an array up to its first nil).
fn from_lua(value: Lua_) -> mlua::Result<Reply> {
    Ok(match value {
        Lua_::Nil | Lua_::Boolean(false) => Reply::Nil,
        Lua_::Boolean(true) => Reply::Int(1),
        Lua_::Integer(n) => Reply::Int(n),
        Lua_::Number(n) => Reply::Int(n as i64),
        Lua_::String(s) => Reply::Text(s.to_str()?.to_string()),
        Lua_::Table(table) => {
            let mut items = Vec::new();
            for i in 1.. {
                let item: Lua_ = table.raw_get(i)?;
                if item.is_nil() {
                    break;
                }
                items.push(from_lua(item)?);
            }
            Reply::List(items)
        }
        other => {
            return Err(mlua::Error::runtime(format!(
                "script returned a {}",
                other.type_name()
            )));
        }
    })
}

/// The host: listens on [`PORT`] and answers until it is crashed.
///
/// # Errors
/// When it cannot listen.
pub async fn host(data: Arc<Mutex<Data>>, run_id: String, observer: Observer) -> turmoil::Result {
    let server = Arc::new(Server {
        data,
        run_id,
        subscribers: Mutex::default(),
        observer,
    });
    let lua = Lua::new();
    let call_server = server.clone();
    let call = lua.create_function(move |lua, args: mlua::Variadic<Lua_>| {
        let args = args
            .iter()
            .map(argument)
            .collect::<mlua::Result<Vec<_>>>()?;
        let reply = call_server.command(&args).map_err(mlua::Error::runtime)?;
        to_lua(lua, reply)
    })?;
    let redis = lua.create_table()?;
    redis.set("call", call)?;
    lua.globals().set("redis", redis)?;
    let lua = Arc::new(Mutex::new(lua));
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let (server, lua) = (server.clone(), lua.clone());
        tokio::spawn(async move {
            let _ = serve(stream, &server, &lua).await;
        });
    }
}

/// Runs `script` with `keys` and `args`: atomically, as Valkey does (nothing else runs meanwhile
/// in a simulated world, which is one thread).
fn eval(lua: &Mutex<Lua>, script: &str, keys: Vec<String>, args: Vec<String>) -> Answered {
    let lua = lock(lua);
    let run = || -> mlua::Result<Reply> {
        lua.globals().set("KEYS", lua.create_sequence_from(keys)?)?;
        lua.globals().set("ARGV", lua.create_sequence_from(args)?)?;
        from_lua(lua.load(script).eval::<Lua_>()?)
    };
    run().map_err(|e| e.to_string())
}

/// One connection: requests answered in order, or a subscription's messages.
async fn serve(
    stream: turmoil::net::TcpStream,
    server: &Server,
    lua: &Mutex<Lua>,
) -> std::io::Result<()> {
    let (read, mut write) = tokio::io::split(stream);
    let mut lines = BufReader::new(read).lines();
    while let Some(line) = lines.next_line().await? {
        let request: Json = serde_json::from_str(&line).unwrap_or(Json::Null);
        if let Some(channel) = request.get("subscribe").and_then(Json::as_str) {
            let (sender, mut messages) = tokio::sync::mpsc::unbounded_channel();
            lock(&server.subscribers)
                .entry(channel.to_owned())
                .or_default()
                .push(sender);
            write.write_all(b"{\"ok\":null}\n").await?;
            while let Some(message) = messages.recv().await {
                write
                    .write_all(format!("{}\n", json!({ "message": message })).as_bytes())
                    .await?;
            }
            return Ok(());
        }
        let answered = if let Some([script, keys, args]) = request
            .get("eval")
            .and_then(Json::as_array)
            .map(Vec::as_slice)
        {
            eval(
                lua,
                script.as_str().unwrap_or_default(),
                strings(keys),
                strings(args),
            )
        } else if let Some(args) = request.get("command") {
            server.command(&strings(args))
        } else {
            Err("bad request".to_owned())
        };
        let line = match answered {
            Ok(reply) => json!({ "ok": reply_json(&reply) }),
            Err(error) => json!({ "err": error }),
        };
        write.write_all(format!("{line}\n").as_bytes()).await?;
    }
    Ok(())
}

fn strings(value: &Json) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| i.as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn reply_json(reply: &Reply) -> Json {
    match reply {
        Reply::Nil => Json::Null,
        Reply::Int(n) => json!(n),
        Reply::Text(text) => json!(text),
        Reply::List(items) => Json::Array(items.iter().map(reply_json).collect()),
    }
}

fn json_reply(value: &Json) -> Reply {
    match value {
        Json::Number(n) => Reply::Int(n.as_i64().unwrap_or_default()),
        Json::String(text) => Reply::Text(text.clone()),
        Json::Array(items) => Reply::List(items.iter().map(json_reply).collect()),
        _ => Reply::Nil,
    }
}

/// The store's link to the simulated Valkey at `host`, with entropy from the world's seed.
pub struct TurmoilLink {
    host: String,
    entropy: Mutex<u64>,
    dns: Dns,
}

impl TurmoilLink {
    /// A link to `host`, its name resolved through `dns`, its entropy drawn from `seed`.
    #[must_use]
    pub fn new(host: &str, seed: u64, dns: Dns) -> Self {
        Self {
            host: host.to_owned(),
            entropy: Mutex::new(seed | 1),
            dns,
        }
    }

    /// Opens a connection to the host, sends `request`, and reads the first line answered: the
    /// lines that follow, for a subscription's messages.
    async fn open(&self, request: &Json) -> Result<(Json, Lines), Lost> {
        let stream = self.dns.connect(&self.host, PORT).await.map_err(|_| Lost)?;
        let (read, mut write) = tokio::io::split(stream);
        write
            .write_all(format!("{request}\n").as_bytes())
            .await
            .map_err(|_| Lost)?;
        let mut lines = BufReader::new(read).lines();
        let line = lines.next_line().await.ok().flatten().ok_or(Lost)?;
        let answer = serde_json::from_str(&line).map_err(|_| Lost)?;
        Ok((answer, lines))
    }

    /// One request and its answer, within the store's timeout.
    async fn call(&self, request: Json) -> Result<Reply, Lost> {
        let exchange = async {
            let (answer, _) = self.open(&request).await?;
            answer.get("ok").map(json_reply).ok_or(Lost)
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .unwrap_or(Err(Lost))
    }
}

/// A connection's answer lines.
type Lines = tokio::io::Lines<BufReader<tokio::io::ReadHalf<turmoil::net::TcpStream>>>;

impl Link for TurmoilLink {
    fn eval<'a>(
        &'a self,
        script: &'static str,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> Pending<'a, Reply> {
        Box::pin(self.call(json!({ "eval": [script, keys, args] })))
    }

    fn command<'a>(&'a self, args: Vec<String>) -> Pending<'a, Reply> {
        Box::pin(self.call(json!({ "command": args })))
    }

    fn subscribe<'a>(&'a self, channel: String) -> Pending<'a, Subscription> {
        Box::pin(async move {
            let open = async {
                let (_, lines) = self.open(&json!({ "subscribe": channel })).await?;
                Ok(Subscription::new(Box::new(Heard_ { lines })))
            };
            tokio::time::timeout(CALL_TIMEOUT, open)
                .await
                .unwrap_or(Err(Lost))
        })
    }

    fn entropy(&self) -> u64 {
        let mut state = lock(&self.entropy);
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state & 0x0000_ffff_ffff_ffff
    }
}

/// A subscription's messages, a line each.
struct Heard_ {
    lines: Lines,
}

impl Messages for Heard_ {
    fn next(&mut self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Heard> + Send + '_>> {
        Box::pin(async move {
            match self.lines.next_line().await {
                Ok(Some(line)) => serde_json::from_str::<Json>(&line)
                    .ok()
                    .and_then(|m| m.get("message").and_then(Json::as_str).map(str::to_owned))
                    .map_or(Heard::Missed, Heard::Message),
                _ => Heard::Closed,
            }
        })
    }
}
