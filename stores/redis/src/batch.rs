//! `begin_batch` and `finish_batch` on one server: one pipeline, one command per unit, one
//! round trip for the whole batch.
//!
//! Each unit gets the command its single call would send first (`SET … NX GET PX`, the script
//! `begin.lua` for a fenced grant, `SET … IFEQ` or the script `finish.lua`), and its reply is
//! read as the single call reads it. What the single call does only on a rare reply (another
//! holder's lock, whose TTL takes a `PTTL`; a lock kept past its TTL; a result written after
//! the lock was lost; a server that lost a script or has no `SET … IFEQ`) is done for that
//! unit alone, after the pipeline, by the single call's own code. The pipeline ignores errors:
//! one unit's error (a key that holds another type, a value that is not idempotask's) is its
//! own answer, never the batch's.
//!
//! A cluster spreads the units over slots and nodes, which one pipeline cannot carry, so
//! `RedisClusterStore` keeps the trait's default, one call per unit.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};

use super::lock::{key_millis, lock_value, memory_millis};
use super::protocol::{BEGIN, FINISH, Protocol, timed_out};
use super::reply::{is_out_of_memory, is_syntax_error, unexpected};
use super::slow_path::begin_script_answer;
use idempotask::store::{
    Begin, Claim, Completion, Fencing, Finish, StoreError, UnitOfWork, begin_each, finish_each,
    ttl_millis,
};

/// Room in a unit's command for what its key, token and marker leave out: the command's name,
/// a script's hash (40 bytes), the options and the numbers.
const COMMAND_EXTRA: usize = 96;

/// `name` with room for `args` more arguments of `size` bytes in all. `redis::cmd` starts both
/// buffers empty and grows them argument by argument, a few reallocations per command, and a
/// batch builds one command per unit.
fn command(name: &str, args: usize, size: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(args + 1, name.len() + size);
    cmd.arg(name);
    cmd
}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Protocol<C> {
    /// [`Store::begin_batch`](idempotask::store::Store::begin_batch): one pipeline where the
    /// connection is to one server, else one `begin` per unit.
    pub(super) async fn begin_batch(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        if self.pipelines {
            self.begin_pipelined(claims, lock_ttl, fencing).await
        } else {
            begin_each(self, claims, lock_ttl, fencing).await
        }
    }

    /// [`Store::finish_batch`](idempotask::store::Store::finish_batch): one pipeline where the
    /// connection is to one server, else one `finish` per unit.
    pub(super) async fn finish_batch(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        if self.pipelines {
            self.finish_pipelined(completions, result_ttl).await
        } else {
            finish_each(self, completions, result_ttl).await
        }
    }

    /// [`Store::begin_batch`](idempotask::store::Store::begin_batch) in one pipeline. The
    /// pipeline has the call timeout of one call, and each unit's follow-up its own: a slow
    /// follow-up never turns another unit's settled answer into a timeout.
    async fn begin_pipelined(
        &self,
        claims: &[Claim<'_>],
        lock_ttl: Duration,
        fencing: Fencing,
    ) -> Vec<Result<Begin, StoreError>> {
        let lock_ms = ttl_millis(lock_ttl);
        let keys = self.keys(claims.iter().map(|claim| claim.unit));
        let mut pipe = Pipeline::with_capacity(claims.len());
        pipe.ignore_errors();
        for (claim, key) in claims.iter().zip(&keys) {
            let size = key.len() + claim.token.as_str().len() + COMMAND_EXTRA;
            let mut cmd;
            if fencing == Fencing::On {
                cmd = command("EVALSHA", 8, size);
                cmd.arg(BEGIN.get_hash())
                    .arg(1)
                    .arg(key)
                    .arg(claim.token.as_str())
                    .arg(lock_ms)
                    .arg(memory_millis(claim.token))
                    .arg("1")
                    .arg(if claim.token.takes_over_doubt() {
                        "1"
                    } else {
                        "0"
                    });
            } else {
                cmd = command("SET", 6, size);
                cmd.arg(key)
                    .arg(lock_value(claim.token))
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(key_millis(claim.token, lock_ms));
            }
            pipe.add_command(cmd);
        }
        let replies = match self.send(&pipe, claims.len()).await {
            Ok(replies) => replies,
            Err(failure) => return self.each_failed("begin", &keys, &failure),
        };
        let mut answers = Vec::with_capacity(claims.len());
        for ((claim, key), reply) in claims.iter().zip(&keys).zip(replies) {
            let answer = match reply {
                Ok(reply) if fencing == Fencing::On => begin_script_answer(key, &reply),
                Ok(Value::Nil) => Ok(Begin::acquired(None)),
                Ok(Value::BulkString(value)) => {
                    self.bounded("begin", self.begin_found(key, claim.token, lock_ms, value))
                        .await
                }
                Ok(other) => Err(unexpected("begin", key, &other)),
                // The server lost the script: the single call loads it and sends it again.
                Err(err) if is_no_script(&err) => {
                    self.bounded(
                        "begin",
                        self.begin_script(key, claim.token, lock_ms, fencing),
                    )
                    .await
                }
                Err(err) => {
                    let err = self.error("begin", key, &err);
                    if is_out_of_memory(&err) {
                        self.bounded("begin", self.begin_read_only(key, claim.token, err))
                            .await
                    } else {
                        Err(err)
                    }
                }
            };
            answers.push(answer);
        }
        answers
    }

    /// [`Store::finish_batch`](idempotask::store::Store::finish_batch) in one pipeline, timed
    /// as [`begin_pipelined`](Self::begin_pipelined) is.
    async fn finish_pipelined(
        &self,
        completions: &[Completion<'_>],
        result_ttl: Duration,
    ) -> Vec<Result<Finish, StoreError>> {
        let ttl = ttl_millis(result_ttl);
        let keys = self.keys(completions.iter().map(|completion| completion.unit));
        let native = self.native_cas.try_now();
        let mut pipe = Pipeline::with_capacity(completions.len());
        pipe.ignore_errors();
        for (completion, key) in completions.iter().zip(&keys) {
            let lock = lock_value(completion.token);
            let size = key.len() + lock.len() + completion.marker.len() + COMMAND_EXTRA;
            let mut cmd;
            if native {
                cmd = command("SET", 6, size);
                cmd.arg(key)
                    .arg(completion.marker)
                    .arg("IFEQ")
                    .arg(lock)
                    .arg("PX")
                    .arg(ttl);
            } else {
                cmd = command("EVALSHA", 6, size);
                cmd.arg(FINISH.get_hash())
                    .arg(1)
                    .arg(key)
                    .arg(lock)
                    .arg(completion.marker)
                    .arg(ttl);
            }
            pipe.add_command(cmd);
        }
        let replies = match self.send(&pipe, completions.len()).await {
            Ok(replies) => replies,
            Err(failure) => return self.each_failed("finish", &keys, &failure),
        };
        let mut answers = Vec::with_capacity(completions.len());
        for ((completion, key), reply) in completions.iter().zip(&keys).zip(replies) {
            let answer = match reply {
                Ok(Value::Okay) if native => {
                    self.native_cas.answered();
                    Ok(Finish::Completed)
                }
                Ok(Value::Nil) if native => {
                    self.native_cas.answered();
                    self.bounded("finish", self.finish_lost(key, completion.marker, ttl))
                        .await
                }
                Ok(Value::Int(1)) if !native => Ok(Finish::Completed),
                Ok(Value::Int(2)) if !native => Ok(Finish::lost_marker_written()),
                Ok(Value::Int(3)) if !native => Ok(Finish::lost_nothing_written()),
                Ok(other) => Err(unexpected("finish", key, &other)),
                // No `SET … IFEQ` after all (refused before doing anything), or a lost script:
                // the single call, which knows both.
                Err(err) if (native && is_syntax_error(&err)) || is_no_script(&err) => {
                    if native && is_syntax_error(&err) {
                        self.native_cas.refused();
                    }
                    self.bounded("finish", self.finish_one(completion, result_ttl))
                        .await
                }
                Err(err) => Err(self.error("finish", key, &err)),
            };
            answers.push(answer);
        }
        answers
    }

    /// The keys of `units`, in order.
    fn keys<'u>(&self, units: impl Iterator<Item = &'u UnitOfWork>) -> Vec<String> {
        units.map(|unit| self.key(unit)).collect()
    }

    /// Sends `pipe` of `len` commands within the call timeout; each command's reply or error,
    /// in order.
    async fn send(
        &self,
        pipe: &redis::Pipeline,
        len: usize,
    ) -> Result<Vec<RedisResult<Value>>, Failure> {
        let mut connection = self.connection.clone();
        let sent = pipe.query_async::<Vec<RedisResult<Value>>>(&mut connection);
        let replies = match self.call_timeout {
            Some(limit) => tokio::time::timeout(limit, sent)
                .await
                .map_err(|_| Failure::TimedOut(limit))?,
            None => sent.await,
        }
        .map_err(Failure::Redis)?;
        if replies.len() == len {
            Ok(replies)
        } else {
            Err(Failure::Redis(RedisError::from((
                ErrorKind::Client,
                "a pipeline's reply",
                format!("{} replies to {len} commands", replies.len()),
            ))))
        }
    }

    /// The failure of a pipeline as a whole, as each unit's answer.
    fn each_failed<T>(
        &self,
        operation: &'static str,
        keys: &[String],
        failure: &Failure,
    ) -> Vec<Result<T, StoreError>> {
        keys.iter()
            .map(|key| {
                Err(match failure {
                    Failure::Redis(err) => self.error(operation, key, err),
                    Failure::TimedOut(limit) => timed_out(operation, *limit),
                })
            })
            .collect()
    }

    /// The single `finish` of one completion, for a reply the pipeline cannot settle (the
    /// pipeline's call timeout bounds it).
    async fn finish_one(
        &self,
        completion: &Completion<'_>,
        result_ttl: Duration,
    ) -> Result<Finish, StoreError> {
        self.finish_call(
            completion.unit,
            completion.token,
            completion.marker,
            result_ttl,
        )
        .await
    }
}

/// Why a pipeline failed as a whole.
enum Failure {
    /// The connection or the server's reply.
    Redis(RedisError),
    /// No reply within the call timeout: ambiguous, as a single call's.
    TimedOut(Duration),
}

/// Whether the server answered `NOSCRIPT` (it runs nothing then).
fn is_no_script(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}
