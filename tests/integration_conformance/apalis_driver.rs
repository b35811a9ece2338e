//! apalis: the layer's service called as an apalis worker calls it.

use std::future::poll_fn;
use std::sync::Arc;

use apalis::prelude::{AbortError, BoxDynError, Service, Task as Job, TaskBuilder};
use idempotask::{RetryPolicy, Task};
use idempotask_redis::RedisStore;
use idempotask_test_support::RedisServer;
use idempotask_test_support::faulty_store::FaultyStore;
use serde::{Deserialize, Serialize};

use super::{
    Body, Case, DROPPED_LOCK_TTL, Driver, Effects, Fault, Integration, LOCK_TTL, Message, Seen,
    Step, ack, drop_once_hung, fault_off, fault_on, hold, key_of, reentered, run_body,
};

pub(super) static APALIS_TASK: Task = Task::new("conformance_apalis")
    .lock_ttl(LOCK_TTL)
    .retry(RetryPolicy::no_wait());

/// An apalis job: its case key (for counting side effects) and what its handler does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Work {
    case_key: String,
    amount: u32,
    body: Body,
}

pub(super) struct Apalis<S> {
    pub(super) _redis: RedisServer,
    pub(super) store: FaultyStore<RedisStore>,
    pub(super) effects: Effects,
    /// Fired by the handler when a hanging body starts.
    pub(super) hung: Arc<tokio::sync::Notify>,
    pub(super) service: S,
    /// The same on a task whose lock runs out soon: for the delivery dropped mid-body.
    pub(super) dropped: S,
}

/// The jobs' handler; it fires `hung` when it starts a hanging body.
pub(super) fn apalis_handler(
    effects: Effects,
    hung: Arc<tokio::sync::Notify>,
) -> impl FnMut(Work) -> std::pin::Pin<Box<dyn Future<Output = Result<f64, BoxDynError>> + Send>>
+ Clone
+ Send
+ 'static {
    move |work: Work| {
        let (effects, hung) = (effects.clone(), Arc::clone(&hung));
        Box::pin(async move {
            if work.body == Body::Hang {
                hung.notify_one();
            }
            run_body(effects, work.case_key, work.body)
                .await
                .map_err(BoxDynError::from)
        })
    }
}

impl<S> Driver for Apalis<S>
where
    S: Service<Job<Work>, Response = f64, Error = BoxDynError> + Send,
    S::Future: Send,
{
    const INTEGRATION: Integration = Integration::Apalis;

    fn effects(&self) -> &Effects {
        &self.effects
    }

    async fn start(&mut self, _case: Case) {
        self.store.down(false);
    }

    async fn step(&mut self, case: Case, step: Step) -> Seen {
        let key = key_of(Self::INTEGRATION, case);
        let work = Work {
            case_key: key.clone(),
            amount: if step.message == Message::OtherPayload {
                6
            } else {
                5
            },
            body: step.body,
        };
        let job = match step.message {
            Message::Keyed | Message::OtherPayload => {
                TaskBuilder::new(work).idempotency_key(key.clone()).build()
            }
            Message::Unkeyed => Job::new(work),
            Message::LongKey => TaskBuilder::new(work)
                .idempotency_key("k".repeat(2000))
                .build(),
        };
        let before = self.effects.of(&key);
        fault_on(&self.store, step.fault);
        let holder = if step.fault == Fault::Holder {
            Some(hold(&APALIS_TASK, &self.store, &self.effects, &key).await)
        } else {
            None
        };
        let hung = Arc::clone(&self.hung);
        let service = if step.body == Body::Hang {
            &mut self.dropped
        } else {
            &mut self.service
        };
        let deliver = async move {
            poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(job).await
        };
        let answered = if step.body == Body::Hang {
            drop_once_hung(deliver, &hung).await;
            None
        } else if step.fault == Fault::Reenter {
            Some(reentered(&APALIS_TASK, &self.store, &key, deliver).await)
        } else {
            Some(deliver.await)
        };
        fault_off(&self.store, step.fault);
        if let Some((finish, holder)) = holder {
            finish.send(()).unwrap();
            holder.await.unwrap();
        }
        let Some(answered) = answered else {
            // The worker is gone mid-job; its backend puts the job back once orphaned, by
            // when the lock has lapsed.
            // The grant came before the body started, so its lock has run out by then.
            tokio::time::sleep(DROPPED_LOCK_TTL).await;
            return Seen::NoAnswer;
        };
        // What apalis decides by: an `AbortError` kills the job, any other error retries it.
        match answered {
            Ok(_) => ack(self.effects.of(&key) > before),
            Err(err) if err.downcast_ref::<AbortError>().is_some() => Seen::DeadLetter,
            Err(_) => Seen::Retry,
        }
    }

    async fn end(&mut self, _case: Case, _seen: &[Seen]) {}
}
