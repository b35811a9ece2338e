//! The bodies the layer hands on: the request body the handler reads, the response body the
//! client gets.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// The request body the wrapped service reads: the body the layer buffered (for requests it
/// runs through the task), or the client's body as it came (for requests it lets through).
pub struct RequestBody<B> {
    inner: RequestInner<B>,
}

enum RequestInner<B> {
    Buffered(Option<Bytes>),
    Streaming(Pin<Box<B>>),
}

impl<B> RequestBody<B> {
    pub(crate) fn buffered(bytes: Bytes) -> Self {
        Self {
            inner: RequestInner::Buffered(Some(bytes).filter(|bytes| !bytes.is_empty())),
        }
    }

    pub(crate) fn streaming(body: B) -> Self {
        Self {
            inner: RequestInner::Streaming(Box::pin(body)),
        }
    }
}

impl<B> fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            RequestInner::Buffered(bytes) => f
                .debug_struct("RequestBody")
                .field("buffered", &bytes.as_ref().map_or(0, Bytes::len))
                .finish(),
            RequestInner::Streaming(_) => f.debug_struct("RequestBody").finish_non_exhaustive(),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for RequestBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match &mut self.get_mut().inner {
            RequestInner::Buffered(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            RequestInner::Streaming(body) => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            RequestInner::Buffered(bytes) => bytes.is_none(),
            RequestInner::Streaming(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            RequestInner::Buffered(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            RequestInner::Streaming(body) => body.size_hint(),
        }
    }
}

/// The response body the client gets: bytes the layer holds (a stored response, a problem
/// answer), then possibly the rest of the handler's own body (a response over the storage
/// cap, or one the layer let through), or the error that body ended with; the handler's
/// trailers follow on the first response (never on a replay).
pub struct ResponseBody<B: Body> {
    prefix: Option<Bytes>,
    tail: Tail<B>,
}

enum Tail<B: Body> {
    End,
    /// The handler's trailers, after the body held (sent on the first response only).
    Trailers(Option<HeaderMap>),
    Stream(Pin<Box<B>>),
    // Boxed, so that the body stays `Unpin` whatever the error type.
    Error(Option<Box<B::Error>>),
}

impl<B: Body> ResponseBody<B> {
    pub(crate) fn full(bytes: Bytes) -> Self {
        Self::then(bytes, Tail::End)
    }

    /// `bytes`, then `trailers` if any.
    pub(crate) fn full_with(bytes: Bytes, trailers: Option<HeaderMap>) -> Self {
        match trailers {
            None => Self::full(bytes),
            Some(trailers) => Self::then(bytes, Tail::Trailers(Some(trailers))),
        }
    }

    pub(crate) fn inner(body: B) -> Self {
        Self {
            prefix: None,
            tail: Tail::Stream(Box::pin(body)),
        }
    }

    /// `prefix`, then the rest of `body`.
    pub(crate) fn resumed(prefix: Bytes, body: Pin<Box<B>>) -> Self {
        Self::then(prefix, Tail::Stream(body))
    }

    /// `prefix`, then `error`.
    pub(crate) fn failed(prefix: Bytes, error: B::Error) -> Self {
        Self::then(prefix, Tail::Error(Some(Box::new(error))))
    }

    fn then(prefix: Bytes, tail: Tail<B>) -> Self {
        Self {
            prefix: Some(prefix).filter(|bytes| !bytes.is_empty()),
            tail,
        }
    }
}

impl<B: Body> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("held", &self.prefix.as_ref().map_or(0, Bytes::len))
            .field("streams_on", &matches!(self.tail, Tail::Stream(_)))
            .finish()
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        if let Some(bytes) = this.prefix.take() {
            return Poll::Ready(Some(Ok(Frame::data(bytes))));
        }
        match &mut this.tail {
            Tail::End => Poll::Ready(None),
            Tail::Trailers(trailers) => {
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t))))
            }
            Tail::Stream(body) => body.as_mut().poll_frame(cx),
            Tail::Error(error) => Poll::Ready(error.take().map(|error| Err(*error))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none()
            && match &self.tail {
                Tail::End => true,
                Tail::Trailers(trailers) => trailers.is_none(),
                Tail::Stream(body) => body.is_end_stream(),
                Tail::Error(error) => error.is_none(),
            }
    }

    fn size_hint(&self) -> SizeHint {
        let held = self.prefix.as_ref().map_or(0, |b| b.len() as u64);
        match &self.tail {
            Tail::End | Tail::Trailers(None) => SizeHint::with_exact(held),
            Tail::Stream(body) => {
                let rest = body.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + held);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + held);
                }
                hint
            }
            // No exact size while trailers are to come: an HTTP/1 server only sends trailers
            // on a chunked response, and an exact size makes it send a Content-Length.
            Tail::Trailers(Some(_)) | Tail::Error(_) => {
                let mut hint = SizeHint::new();
                hint.set_lower(held);
                hint
            }
        }
    }
}
