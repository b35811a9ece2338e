//! What a case does to its call: a fault injected at one store operation, or a drop of the
//! call at one point where it waits.

/// A fault injected at one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Fault {
    /// The store refuses the operation before applying it; the caller knows it did not apply.
    Refused,
    /// The operation times out without applying; the caller cannot know it did not.
    Unconfirmed,
    /// The operation applies and its reply is lost: the caller sees an ambiguous timeout.
    ReplyLost,
    /// The operation times out, and applies later: after the next operation (or once the call
    /// is over, if there is none).
    AppliedLate,
    /// The store goes down: this operation and every later one of the call is refused.
    Down,
    /// The operation applies and its reply is lost; the client sends it again (as the cluster
    /// client does), and the call gets the second answer.
    Resent,
    /// The operation reaches the store only once the call's lock TTL has passed, and its
    /// answer reaches the call.
    Overdue,
    /// As [`Overdue`](Self::Overdue), and its reply is lost.
    OverdueReplyLost,
    /// As [`Overdue`](Self::Overdue), and the client sends it again.
    OverdueResent,
    /// The operation reaches the store once the call's lock TTL has passed and a second
    /// delivery took the unit (and was then killed: its lock runs out).
    TakenOver,
    /// As [`TakenOver`](Self::TakenOver), and its reply is lost.
    TakenOverReplyLost,
    /// The operation applies at once; its answer reaches the call only once the lock TTL has
    /// passed (a grant that comes too late to use, a confirmation the call cannot trust).
    AnsweredLate,
    /// As [`AnsweredLate`](Self::AnsweredLate), and a second delivery takes the unit before
    /// the answer comes.
    AnsweredLateTakenOver,
}

impl Fault {
    pub(super) const ALL: [Self; 13] = [
        Self::Refused,
        Self::Unconfirmed,
        Self::ReplyLost,
        Self::AppliedLate,
        Self::Down,
        Self::Resent,
        Self::Overdue,
        Self::OverdueReplyLost,
        Self::OverdueResent,
        Self::TakenOver,
        Self::TakenOverReplyLost,
        Self::AnsweredLate,
        Self::AnsweredLateTakenOver,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Unconfirmed => "timed out, not applied",
            Self::ReplyLost => "reply lost",
            Self::AppliedLate => "applied late",
            Self::Down => "store down",
            Self::Resent => "reply lost, re-sent",
            Self::Overdue => "past the lock TTL",
            Self::OverdueReplyLost => "past the TTL, reply lost",
            Self::OverdueResent => "past the TTL, re-sent",
            Self::TakenOver => "taken over first",
            Self::TakenOverReplyLost => "taken over, reply lost",
            Self::AnsweredLate => "answered past the TTL",
            Self::AnsweredLateTakenOver => "answered past, taken over",
        }
    }

    /// Whether the fault is worth injecting at `operation`. A delay past the lock TTL says
    /// something of the operations that take or use a lock, not of an operator's read; and a
    /// `begin` that reaches the store late takes a fresh lock, so only its answer is delayed.
    pub(super) fn fits(self, operation: &str) -> bool {
        match self {
            Self::Overdue
            | Self::OverdueReplyLost
            | Self::OverdueResent
            | Self::TakenOver
            | Self::TakenOverReplyLost => matches!(operation, "finish" | "renew" | "release"),
            Self::AnsweredLate | Self::AnsweredLateTakenOver => {
                matches!(operation, "begin" | "finish" | "renew" | "release")
            }
            _ => true,
        }
    }
}

/// Where the call under test can be suspended, and so dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Point {
    /// Its `n`th store operation is about to be sent.
    Before(usize),
    /// Its `n`th store operation applied; the reply has not reached the call yet.
    After(usize),
    /// Its body started and has not done its side effect yet.
    BodyStarted,
    /// Its body did its side effect and has not returned yet.
    BodyDone,
}

/// What to do to one case's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    Nothing,
    Inject { at: usize, fault: Fault },
    DropAt(Point),
}
