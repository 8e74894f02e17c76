//! The bound on batches in service: at most [`MAX_BATCHES_IN_SERVICE`] requests whose memory
//! grows with their size — `POST /v1/seq/batch`, and `POST /v1/ids` of more than
//! [`MAX_IDS_UNBATCHED`] — hold a place at once, from before the body is read until the reply
//! has been handed to the connection whole. Each holds at most [`BATCH_BYTES`], so all of them
//! together at most the product; every other request's memory is bounded per connection.
//!
//! A request that finds no place waits [`BATCH_WAIT`] at most (less if the caller's deadline is
//! shorter), then is answered 429 `overloaded` with `Retry-After`, having taken nothing; its
//! body is read and dropped, a chunk at a time, so the caller's connection stays usable.
//!
//! The place travels with the reply ([`reply`]): the reply body hands its bytes to hyper a
//! chunk at a time (hyper buffers at most [`MAX_BUFFERED_BYTES`] ahead of the socket) and gives
//! the place back with its last chunk, or when the connection drops it. A caller that reads a
//! reply too slowly to take it whole within [`WRITE_TIMEOUT`] loses its connection, so a place
//! is held for a bounded time whatever the caller does.
//!
//! Left out: a fair queue (the semaphore serves waiters in order of arrival, which is enough),
//! and bounds per caller (one caller can take every place; the 429 tells it to send fewer).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::errors::Failure;
#[cfg(doc)]
use super::{BATCH_BYTES, BATCH_WAIT, MAX_BATCHES_IN_SERVICE, MAX_IDS_UNBATCHED};
use super::{BODY_TIMEOUT, MAX_BODY_BYTES, MAX_BUFFERED_BYTES, WRITE_TIMEOUT};
use crate::calls::{CallError, ErrorKind};
use crate::{Front, count_call};

/// The places of one front end (shared by its routes).
#[derive(Debug, Clone)]
pub(super) struct Batches {
    places: Arc<Semaphore>,
    most: usize,
    wait: Duration,
}

/// One batch's place; given back when dropped.
pub(super) type Place = OwnedSemaphorePermit;

impl Batches {
    pub(super) fn new(most: usize, wait: Duration) -> Self {
        Self {
            places: Arc::new(Semaphore::new(most)),
            most,
            wait,
        }
    }

    /// A place, within the wait or the caller's `deadline` if shorter; else the 429 (counted as
    /// an `overloaded` call).
    pub(super) async fn admit(&self, deadline: Option<Duration>) -> Result<Place, Failure> {
        let wait = deadline.map_or(self.wait, |d| d.min(self.wait));
        if let Ok(Ok(place)) = tokio::time::timeout(wait, self.places.clone().acquire_owned()).await {
            return Ok(place);
        }
        // Timed out (the semaphore is never closed).
        let e = CallError::new(
            ErrorKind::Overloaded,
            format!(
                "too many batches in service at once (the most is {}); retry after a pause, with fewer at once",
                self.most
            ),
        );
        count_call(Front::Http, &Err::<(), _>(e.clone()));
        Err(e.into())
    }
}

/// Reads `body` to its end and drops it a chunk at a time (at most [`MAX_BODY_BYTES`] and
/// [`BODY_TIMEOUT`]; past either the connection is closed after the reply, as for any body left
/// unread), so that a refused caller's connection stays usable without holding its body.
pub(super) async fn drain(body: Body) {
    let mut body = body;
    let mut read = 0usize;
    let _ = tokio::time::timeout(BODY_TIMEOUT, async {
        while read <= MAX_BODY_BYTES {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                _ => return,
            }
        }
    })
    .await;
}

/// A 200 JSON reply of `json` that keeps `place` until its last byte is handed to the
/// connection (or the connection drops it).
pub(super) fn reply(place: Place, json: Vec<u8>) -> Response {
    let body = PlacedBody {
        rest: Bytes::from(json),
        place: Some(place),
        deadline: Instant::now() + WRITE_TIMEOUT,
    };
    let mut r = Body::new(body).into_response();
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A reply body handed out [`MAX_BUFFERED_BYTES`] at a time, holding its batch's place until
/// the last chunk is out.
struct PlacedBody {
    rest: Bytes,
    place: Option<Place>,
    /// Past it, the next chunk is an error: hyper closes the connection and drops the place.
    deadline: Instant,
}

impl hyper::body::Body for PlacedBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.rest.is_empty() {
            self.place = None;
            return Poll::Ready(None);
        }
        // Checked only when hyper asks for more: a caller that stops reading altogether is cut
        // off by the connection's write timeout instead, which drops this body.
        if Instant::now() > self.deadline {
            self.place = None;
            return Poll::Ready(Some(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("a batch's reply was not taken within {WRITE_TIMEOUT:?}"),
            ))));
        }
        let n = self.rest.len().min(MAX_BUFFERED_BYTES);
        let chunk = self.rest.split_to(n);
        if self.rest.is_empty() {
            self.place = None;
        }
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The place is given back with the last chunk, not before; the chunks add up to the reply.
    #[tokio::test]
    async fn the_place_is_held_until_the_last_chunk_is_out() {
        let batches = Batches::new(1, Duration::from_millis(1));
        let place = batches.admit(None).await.unwrap();
        let json: Vec<u8> = (0..MAX_BUFFERED_BYTES * 2 + 7).map(|i| i as u8).collect();
        let mut body = reply(place, json.clone()).into_body();
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            out.extend_from_slice(frame.unwrap().data_ref().unwrap());
            let given_back = usize::from(out.len() == json.len());
            assert_eq!(
                batches.places.available_permits(),
                given_back,
                "after {} bytes",
                out.len()
            );
        }
        assert_eq!(out, json);
        assert_eq!(batches.places.available_permits(), 1);
    }

    /// A reply not taken whole in time fails on the next chunk asked for, and gives the place back.
    #[tokio::test(start_paused = true)]
    async fn a_reply_taken_too_slowly_fails_and_gives_the_place_back() {
        let batches = Batches::new(1, Duration::from_millis(1));
        let place = batches.admit(None).await.unwrap();
        let mut body = reply(place, vec![b' '; MAX_BUFFERED_BYTES * 2]).into_body();
        assert!(body.frame().await.unwrap().is_ok());
        tokio::time::sleep(WRITE_TIMEOUT + Duration::from_millis(1)).await;
        assert!(body.frame().await.unwrap().is_err());
        assert_eq!(batches.places.available_permits(), 1);
    }
}
