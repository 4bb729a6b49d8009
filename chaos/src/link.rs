//! A replica's link to Valkey: a TCP relay that a partition cuts. Cut, it forwards nothing in
//! either direction and holds what it read (as a network that drops every packet would: the
//! connections stay open and nothing arrives); healed, it forwards again.

use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A relay from a loopback port to Valkey's.
pub struct Link {
    /// Where the replica connects.
    pub port: u16,
    cut: Arc<watch::Sender<bool>>,
    task: JoinHandle<()>,
}

impl Link {
    /// Starts a relay to Valkey on `valkey_port`, on the current tokio runtime.
    ///
    /// # Errors
    /// When it cannot listen.
    pub fn start(valkey_port: u16) -> Result<Self, String> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let (cut, _) = watch::channel(false);
        let cut = Arc::new(cut);
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| "a link needs a tokio runtime".to_owned())?;
        let relay_cut = cut.clone();
        let task = handle.spawn(async move {
            let Ok(listener) = TcpListener::from_std(listener) else {
                return;
            };
            let mut pipes = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", valkey_port)).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                pipes.spawn(pipe(client_read, server_write, relay_cut.subscribe()));
                pipes.spawn(pipe(server_read, client_write, relay_cut.subscribe()));
                while pipes.try_join_next().is_some() {}
            }
        });
        Ok(Self { port, cut, task })
    }

    /// Cuts (`true`) or heals (`false`) the link.
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    /// Stops the relay and every connection through it.
    pub fn stop(&self) {
        self.task.abort();
    }
}

/// Forwards `from` to `to` while the link is whole.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut cut: watch::Receiver<bool>) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = cut.wait_for(|c| *c) => continue,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // What was read while the link was being cut is held until it heals.
        if cut.wait_for(|c| !*c).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
