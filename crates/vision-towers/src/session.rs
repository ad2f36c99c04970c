//! The vocabulary of a tower held for a stream of passes ([`crate::Model::encode_stream`]):
//! two ends joined by a channel of the family's own pass inputs (the ends themselves are the
//! engine's: `engine.rs` for the host path and the CUDA maker, `cuda_engine.rs` for the CUDA
//! session). The maker ([`PassMaker`], on the producer's thread)
//! builds each pass's input (on CUDA the tower's host half of `prepare`: validation, patch rows
//! in the GEMM precision, which needs no device); the session ([`StreamSession`], on the thread
//! that holds the tower) stages it (on CUDA: uploaded from page-locked memory on a copy stream)
//! while the previous pass runs, launches it behind that pass, and collects its rows after the
//! next is launched (on CUDA read back while the next pass runs: gpu-core's `PassQueue`).
//! The input travels as its family's type from one end to the other; nothing is type-erased.

use std::sync::mpsc::{channel, Receiver, Sender};

use vision_prep::Prepared;

use crate::tower_error::InputError;

/// Which pass a maker made; the session takes the inputs back in the order they were made.
#[derive(Debug)]
pub(crate) struct PassTicket(u64);

/// The producer's end of a stream: builds pass inputs.
pub(crate) trait PassMaker: Send {
    /// Builds the input of a pass from its prepared images and hands it to the session. Returns
    /// its ticket and the prepared images the input no longer needs (all of them on CUDA, for
    /// the preprocessor to recycle; none on the host, whose input owns them).
    fn make(&mut self, prepared: Vec<Prepared>) -> Result<(PassTicket, Vec<Prepared>), InputError>;
}

/// The tower's end of a stream: stages, launches and collects the passes made for it.
pub(crate) trait StreamSession {
    /// Stages the pass of `ticket` (`patches` patches): on CUDA its upload is queued on the copy
    /// stream and overlaps the pass in flight.
    fn stage(&mut self, ticket: PassTicket, patches: usize) -> Result<(), InputError>;
    /// Launches the staged pass of `patches` patches (CUDA: queued behind the pass in flight,
    /// returns at once; host: runs it). At most two passes are launched and not collected.
    fn launch(&mut self, patches: usize) -> Result<(), InputError>;
    /// The rows of the oldest pass launched and not collected, per image (waits for it); `None`
    /// when there is none.
    fn collect(&mut self) -> Result<Option<Vec<Vec<f32>>>, InputError>;
}

/// The sending half of a stream's channel of pass inputs.
pub(crate) struct Outbox<T> {
    next: u64,
    tx: Sender<(u64, T)>,
}

/// The receiving half of a stream's channel of pass inputs.
pub(crate) struct Inbox<T> {
    rx: Receiver<(u64, T)>,
}

/// A channel of pass inputs of type `T`, in order.
pub(crate) fn pass_channel<T>() -> (Outbox<T>, Inbox<T>) {
    let (tx, rx) = channel();
    (Outbox { next: 0, tx }, Inbox { rx })
}

impl<T> Outbox<T> {
    /// Sends the input of the next pass; its ticket for the session.
    pub(crate) fn send(&mut self, input: T) -> Result<PassTicket, InputError> {
        let n = self.next;
        self.next += 1;
        self.tx
            .send((n, input))
            .map_err(|_| InputError::Message("the stream's session has ended".into()))?;
        Ok(PassTicket(n))
    }
}

impl<T> Inbox<T> {
    /// The input of the pass of `ticket` (made before the ticket was handed over).
    pub(crate) fn take(&self, ticket: PassTicket) -> Result<T, InputError> {
        match self.rx.recv() {
            Ok((n, input)) if n == ticket.0 => Ok(input),
            _ => Err(InputError::Message(
                "a pass prepared for another session".into(),
            )),
        }
    }
}

/// The error of a launch with nothing staged.
pub(crate) fn not_staged() -> InputError {
    InputError::Message("a pass launched before it was staged".into())
}
