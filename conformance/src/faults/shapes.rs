//! The shapes of call the harness faults: what the unit holds before the call, what its body
//! does and who calls.

use idempotask::InDoubt;

/// What the unit holds before the call under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Prior {
    Nothing,
    /// A delivery with the same arguments succeeded.
    Done,
    /// Another delivery holds the lock for longer than the case lasts.
    Held,
    /// Another delivery's lock ran out without a release or a result: the unit is in doubt.
    Lapsed,
}

/// What the body of a delivery does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Body {
    Succeeds,
    Fails,
    /// Succeeds once a renewal of its lock reached the store.
    OutlastsARenewal,
}

/// Who calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    /// A delivery, with the arguments of the stored result, or with other ones.
    Delivery { other_arguments: bool },
    /// An operator reading the unit's status.
    Operator,
}

/// One shape of call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub(super) name: &'static str,
    pub(super) prior: Prior,
    pub(super) body: Body,
    pub(super) fencing: bool,
    pub(super) caller: Caller,
    pub(super) in_doubt: InDoubt,
    /// Whether the store remembers the call's lock once it ran out (the task's doubt memory).
    pub(super) remembered: bool,
}

impl Shape {
    /// Whether the shape needs a store that remembers a lock that ran out.
    pub(super) fn takes_over_doubt(&self) -> bool {
        self.prior == Prior::Lapsed
    }

    pub(super) fn runs_a_body(&self) -> bool {
        self.caller != Caller::Operator
            && match self.prior {
                Prior::Nothing => true,
                Prior::Lapsed => self.in_doubt != InDoubt::Hold,
                Prior::Done | Prior::Held => false,
            }
    }
}

const PLAIN: Shape = Shape {
    name: "fresh",
    prior: Prior::Nothing,
    body: Body::Succeeds,
    fencing: false,
    caller: Caller::Delivery {
        other_arguments: false,
    },
    in_doubt: InDoubt::Rerun,
    remembered: true,
};

pub(super) const SHAPES: [Shape; 12] = [
    PLAIN,
    Shape {
        name: "fresh, fenced",
        fencing: true,
        ..PLAIN
    },
    // Without a doubt memory, a lock that ran out is gone: a finish after it stores the
    // result flagged as written after the lock was lost.
    Shape {
        name: "fresh, no doubt memory",
        remembered: false,
        ..PLAIN
    },
    Shape {
        name: "the body fails",
        body: Body::Fails,
        ..PLAIN
    },
    Shape {
        name: "renewed while it runs",
        body: Body::OutlastsARenewal,
        ..PLAIN
    },
    Shape {
        name: "a duplicate",
        prior: Prior::Done,
        ..PLAIN
    },
    Shape {
        name: "a duplicate with other arguments",
        prior: Prior::Done,
        caller: Caller::Delivery {
            other_arguments: true,
        },
        ..PLAIN
    },
    Shape {
        name: "the unit is held",
        prior: Prior::Held,
        ..PLAIN
    },
    Shape {
        name: "taken over in doubt",
        prior: Prior::Lapsed,
        ..PLAIN
    },
    Shape {
        name: "taken over in doubt, fenced",
        prior: Prior::Lapsed,
        fencing: true,
        ..PLAIN
    },
    Shape {
        name: "held in doubt",
        prior: Prior::Lapsed,
        in_doubt: InDoubt::Hold,
        ..PLAIN
    },
    Shape {
        name: "an operator's status",
        prior: Prior::Done,
        caller: Caller::Operator,
        ..PLAIN
    },
];
