//! The owner's side of the direct hop: takes answered from memory, the rest sent back the long way.

use std::sync::Arc;
use std::time::Duration;

use seqsvr_client::MapView;
use seqsvr_proto::SectionId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, info, warn};

use super::wire::{self, Answer, Subject};
use crate::error::Error;
use crate::service::Service;
use crate::state::AllocState;

/// Most connections served at once. Each peer keeps one; the rest of the room is for restarts
/// that overlap, not for strangers (a connection over the cap is closed at once).
const MAX_CONNECTIONS: usize = 256;
/// How long a new connection has to send its preface.
const PREFACE_WITHIN: Duration = Duration::from_secs(5);
/// A connection that sends nothing for this long is closed (its peer reconnects when it needs to).
const IDLE: Duration = Duration::from_secs(300);

/// Serves the hop on `listener` until `stop` turns true.
pub fn serve(
    listener: TcpListener,
    shared: Arc<AllocState>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let room = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut stop_accept = stop.clone();
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop_accept.wait_for(|s| *s) => return,
            };
            let (stream, from) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    warn!(error = %e, "hop: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = room.clone().try_acquire_owned() else {
                warn!(%from, "hop: {MAX_CONNECTIONS} connections already; closing a new one");
                continue;
            };
            let (shared, stop) = (shared.clone(), stop.clone());
            tokio::spawn(async move {
                if let Err(why) = connection(stream, shared, stop).await {
                    debug!(%from, %why, "hop: connection closed");
                }
                drop(permit);
            });
        }
    })
}

/// This node's map as the hop checks answers by: rebuilt when the node learns a newer one.
struct Map {
    version: u64,
    view: Option<MapView>,
}

impl Map {
    fn current(&mut self, shared: &AllocState) -> Option<&MapView> {
        let version = shared.map_version();
        if version != self.version || self.view.is_none() {
            self.version = version;
            self.view = shared.map().and_then(|m| MapView::new(&m).ok());
        }
        self.view.as_ref().filter(|v| v.version() == version)
    }
}

async fn connection(
    mut stream: TcpStream,
    shared: Arc<AllocState>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let mut preface = [0u8; wire::PREFACE.len()];
    tokio::time::timeout(PREFACE_WITHIN, stream.read_exact(&mut preface))
        .await
        .map_err(|_| "no preface in time".to_string())?
        .map_err(|e| e.to_string())?;
    if &preface != wire::PREFACE {
        return Err(format!("not a hop preface: {:?}", String::from_utf8_lossy(&preface)));
    }
    let service = Service::new(shared.clone());
    let mut map = Map { version: 0, view: None };
    let (mut inbuf, mut out) = (Vec::with_capacity(16 * 1024), Vec::with_capacity(16 * 1024));
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = tokio::time::timeout(IDLE, stream.read(&mut chunk)) => match r {
                Ok(r) => r.map_err(|e| e.to_string())?,
                Err(_) => return Err("idle".into()),
            },
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        if n == 0 {
            return Ok(());
        }
        inbuf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        // Every whole request read so far is answered, and the answers go out in one write.
        while let Some((id, subject, used)) = wire::take_request(&inbuf[at..]).map_err(|e| e.to_string())? {
            let answer = answer(&service, &shared, &mut map, subject);
            wire::put_answer(&mut out, id, &answer);
            at += used;
        }
        inbuf.drain(..at);
        if !out.is_empty() {
            stream.write_all(&out).await.map_err(|e| e.to_string())?;
            out.clear();
        }
    }
}

/// The answer to one take: from memory, under this node's map, or the long way.
fn answer(service: &Service, shared: &AllocState, map: &mut Map, subject: Subject<'_>) -> Answer {
    let set = shared.params().set_id;
    // As the front ends' own calls: only when this node's map lets its set answer the section
    // (the forwarding node checks the answer against its map too, as the client library does).
    let may_answer = |section: SectionId| map.current(shared).is_some_and(|v| v.may_answer(section, set));
    let taken = match subject {
        Subject::Uid(uid) => service.take_now(uid, None, 1, may_answer),
        Subject::Key(bytes) => match std::str::from_utf8(bytes) {
            Ok(key) => service.take_now(0, Some(key), 1, may_answer),
            Err(e) => return Answer::BadInput(format!("a counter key must be UTF-8: {e}")),
        },
    };
    match taken {
        Some(Ok((value, owner))) => Answer::Served { value, owner },
        Some(Err(Error::InvalidArgument(m))) => Answer::BadInput(m),
        Some(Err(Error::Exhausted(m))) => Answer::Exhausted(m),
        Some(Err(Error::Unavailable(_))) | None => Answer::LongWay,
    }
}

/// Binds the hop's listener: `at`, for a node whose data plane is reached at `data_plane`.
pub async fn bind(at: std::net::SocketAddr, data_plane: &str) -> std::io::Result<(TcpListener, String)> {
    let listener = TcpListener::bind(at).await?;
    let bound = listener.local_addr()?;
    let advertised = crate::peers::advertised(bound, data_plane);
    info!(%bound, %advertised, "direct forwarding hop listening");
    Ok((listener, advertised))
}
