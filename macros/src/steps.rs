//! Steps as written in the task's body: `ctx.step(name, effect)`, whose recorded values a rerun
//! matches by their place and their name, so each name must be known here and tell its step
//! apart from the body's others.
//!
//! A step is a call of `step`, `step_or_hold` or `step_or_reconcile` on the task's context,
//! as [`Contexts`] follows it through the body's bindings; another type's `step` is left alone.
//! The body of a nested call run in place (`TASK.call(key).run(async { .. })`) has a journal
//! of its own, so its steps are checked as a body apart.
//!
//! Each step is then routed through the runtime's `__private` twin of its method, whose one
//! bound on the value names the codec, spanned at the effect so that rustc reports a value that
//! cannot be stored once, there.

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{ToTokens, quote_spanned};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Block, Expr, LitStr, Path};

use crate::args::Errors;
use crate::context::{Contexts, names, unwrapped as unparenthesized};
use crate::key::respan;

/// Input: the task's body and the `crate = path` option. Output: an error for each step whose
/// name is not a literal (or a literal with a key part), each literal name given to two steps,
/// and each step without a key part that can run more than once (in a loop or a closure); the
/// body with its steps routed through `__private`.
pub(crate) fn check_body(body: &mut Block, krate: Option<&Path>, errors: &mut Errors) {
    let mut checker = StepChecker {
        errors,
        runtime: krate.map_or_else(|| quote::quote!(::idempotask), ToTokens::to_token_stream),
        contexts: Contexts::new(krate),
        repeated: Vec::new(),
        names: Vec::new(),
        routed: 0,
    };
    checker.visit_block_mut(body);
}

/// What makes the code around a step run more than once per body, with the name it binds for
/// each run when there is one (`recipient` in `for recipient in ..`), for the help to show.
enum Repeat {
    For(Option<String>),
    While(Option<String>),
    Loop,
    Closure(Option<String>),
}

impl Repeat {
    fn describe(&self) -> &'static str {
        match self {
            Self::For(_) => "in a `for` loop",
            Self::While(_) => "in a `while` loop",
            Self::Loop => "in a `loop`",
            Self::Closure(_) => "in a closure, which can be called more than once",
        }
    }

    /// What the help names as the key part.
    fn part(&self) -> &str {
        match self {
            Self::For(Some(name)) | Self::While(Some(name)) | Self::Closure(Some(name)) => name,
            _ => "item",
        }
    }
}

/// The one name `pat` binds, if it binds exactly one: `recipient`, `&recipient`,
/// `Some(job)`, `order: &Order`.
fn single_binding(pat: &syn::Pat) -> Option<String> {
    match <[String; 1]>::try_from(names(pat)) {
        Ok([name]) => Some(name),
        Err(_) => None,
    }
}

/// A step's name as written.
enum Name<'e> {
    /// `"charge"`: one step.
    Literal(&'e LitStr),
    /// `("mail", recipient)`: a step per key part.
    Keyed,
    /// Anything else, with the expression to blame and what to write instead.
    Unknown(&'e Expr, &'static str),
}

/// Input: a step's first argument. Output: what kind of name it is.
fn name_of(expr: &Expr) -> Name<'_> {
    match unparenthesized(expr) {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(literal),
            ..
        }) => Name::Literal(literal),
        Expr::Tuple(tuple) if tuple.elems.len() == 2 => match unparenthesized(&tuple.elems[0]) {
            Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(_),
                ..
            }) => Name::Keyed,
            other => Name::Unknown(
                other,
                "write the name as a literal and keep what varies in the key part: `(\"mail\", recipient)`",
            ),
        },
        Expr::Tuple(tuple) => Name::Unknown(
            expr,
            if tuple.elems.is_empty() {
                "write the name as a literal, `\"charge\"`, or with a key part: `(\"mail\", recipient)`"
            } else {
                "a name with a key part is a pair of a literal and the part: `(\"mail\", recipient)`"
            },
        ),
        other => Name::Unknown(
            other,
            "write the name as a literal, `\"charge\"`, and put what varies in a key part: `(\"mail\", recipient)`",
        ),
    }
}

/// Where a span starts, for a note that points at another place than the error: known inside
/// the compiler only, not in the crate's unit tests.
fn line_of(span: Span) -> Option<usize> {
    proc_macro::is_available().then(|| span.unwrap().line())
}

/// Whether `expr` is a `Call` built in the same expression, `TASK.call(key).store(..)`, so that
/// `.run(..)` on it runs a nested unit with a journal of its own.
fn is_nested_call(expr: &Expr) -> bool {
    match unparenthesized(expr) {
        Expr::MethodCall(call) => call.method == "call" || is_nested_call(&call.receiver),
        _ => false,
    }
}

struct StepChecker<'a> {
    errors: &'a mut Errors,
    /// The runtime's path, `::idempotask` unless `crate = ..` names another.
    runtime: TokenStream,
    contexts: Contexts<'a>,
    /// The loops and closures around the expression being walked, innermost last.
    repeated: Vec<Repeat>,
    /// The literal names of the body's steps that run once, with where each is first given.
    names: Vec<(String, Span)>,
    /// How many steps were routed, to know whether a macro's arguments changed.
    routed: usize,
}

impl StepChecker<'_> {
    /// Input: the name of a step. Output: the error it earns, if any, with the name recorded
    /// for the body's later steps.
    fn check_name(&mut self, name: &Expr) {
        match name_of(name) {
            Name::Keyed => {}
            Name::Unknown(blamed, help) => self.errors.spanned(
                blamed,
                format!(
                    "a step's name must be a string literal, so that reruns match it to the recorded steps\n\
                     = note: a rerun matches each step to its record by place and name; only a literal is known here to be the same on every run and unique in the body\n\
                     = help: {help}"
                ),
            ),
            Name::Literal(literal) => {
                let value = literal.value();
                if let Some(repeat) = self.repeated.last() {
                    self.errors.at(
                        literal.span(),
                        format!(
                            "a step that can run more than once per body needs a key part, like `ctx.step((\"mail\", recipient), ..)`\n\
                             = note: this step is {}: each run would record a step named `{value}`, told apart from the others by its order alone\n\
                             = help: add the key part that tells its runs apart: `({}, {})`",
                            repeat.describe(),
                            literal.token(),
                            repeat.part(),
                        ),
                    );
                } else if let Some((_, first)) = self.names.iter().find(|(seen, _)| *seen == value)
                {
                    let first = line_of(*first)
                        .map(|line| {
                            format!("\n= note: the first step named `{value}` is on line {line}")
                        })
                        .unwrap_or_default();
                    self.errors.at(
                        literal.span(),
                        format!(
                            "two steps of this body are named `{value}`{first}\n\
                             = note: a rerun matches each step to its record by place and name: two steps of one name are told apart by their order alone\n\
                             = help: give each step a name of its own"
                        ),
                    );
                } else {
                    self.names.push((value, literal.span()));
                }
            }
        }
    }

    /// Walks `then` with `repeat` around it.
    fn repeated(&mut self, repeat: Repeat, then: impl FnOnce(&mut Self)) {
        self.repeated.push(repeat);
        then(self);
        self.repeated.pop();
    }
}

/// Whether `call` is one of `TaskContext`'s step methods by its name and its number of
/// arguments: `step` and `step_or_hold` (name, effect), `step_or_reconcile` (name, reconcile,
/// effect). Whether its receiver is the context is [`Contexts`]'s to say.
fn is_step_method(call: &syn::ExprMethodCall) -> bool {
    match call.args.len() {
        2 => call.method == "step" || call.method == "step_or_hold",
        3 => call.method == "step_or_reconcile",
        _ => false,
    }
}

impl StepChecker<'_> {
    fn is_step(&self, call: &syn::ExprMethodCall) -> bool {
        is_step_method(call) && self.contexts.is_context(&call.receiver)
    }

    /// Input: `ctx.step(name, effect)`, with its `.await` when it has one. Output:
    /// `::idempotask::__private::step(&ctx, name, effect)`, every token of it and of its
    /// `.await` spanned at the effect, so that the bounds the call and its future carry are
    /// one error there.
    fn route(&mut self, call: &syn::ExprMethodCall, awaited: bool) -> Expr {
        self.routed += 1;
        let effect = call
            .args
            .last()
            .map_or_else(|| call.method.span(), Spanned::span);
        let runtime = respan(self.runtime.clone(), effect);
        let function = syn::Ident::new(&call.method.to_string(), effect);
        let mut receiver = Group::new(Delimiter::None, call.receiver.to_token_stream());
        receiver.set_span(effect);
        let args = call.args.iter();
        let mut routed = quote_spanned! {effect=>
            #runtime::__private::#function(&#receiver, #(#args),*)
        };
        if awaited {
            routed = quote_spanned! {effect=> #routed.await };
        }
        Expr::Verbatim(routed)
    }

    /// Input: a step, awaited or not. Output: its name checked, its arguments walked and the
    /// step routed in place.
    fn step(&mut self, expr: &mut Expr, awaited: bool) {
        let call = match expr {
            Expr::MethodCall(call) => call,
            Expr::Await(awaited) => match &mut *awaited.base {
                Expr::MethodCall(call) => call,
                _ => unreachable!("an awaited step was checked to be a method call"),
            },
            _ => unreachable!("a step was checked to be a method call"),
        };
        self.check_name(&call.args[0]);
        visit_mut::visit_expr_method_call_mut(self, call);
        let routed = self.route(call, awaited);
        *expr = routed;
    }

    /// Walks a nested unit's `.run(..)`: it runs once per its own key, and records its own
    /// journal.
    fn nested_run(&mut self, call: &mut syn::ExprMethodCall) {
        self.visit_expr_mut(&mut call.receiver);
        let outer = (
            std::mem::take(&mut self.repeated),
            std::mem::take(&mut self.names),
        );
        for arg in &mut call.args {
            self.visit_expr_mut(arg);
        }
        (self.repeated, self.names) = outer;
    }
}

impl VisitMut for StepChecker<'_> {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        match expr {
            Expr::MethodCall(call) if self.is_step(call) => self.step(expr, false),
            Expr::Await(awaited) if matches!(&*awaited.base, Expr::MethodCall(call) if self.is_step(call)) =>
            {
                self.step(expr, true);
            }
            Expr::MethodCall(call)
                if (call.method == "run" || call.method == "run_reported")
                    && is_nested_call(&call.receiver) =>
            {
                self.nested_run(call);
            }
            _ => visit_mut::visit_expr_mut(self, expr),
        }
    }

    fn visit_block_mut(&mut self, block: &mut Block) {
        self.contexts.enter();
        visit_mut::visit_block_mut(self, block);
        self.contexts.leave();
    }

    fn visit_local_mut(&mut self, local: &mut syn::Local) {
        // The names a `let` binds exist after its initializer, not in it.
        if let Some(init) = &mut local.init {
            self.visit_expr_mut(&mut init.expr);
            if let Some((_, diverge)) = &mut init.diverge {
                self.visit_expr_mut(diverge);
            }
        }
        let init = local.init.as_ref().map(|init| &*init.expr);
        self.contexts.bind(&local.pat, init);
    }

    fn visit_expr_let_mut(&mut self, bound: &mut syn::ExprLet) {
        self.visit_expr_mut(&mut bound.expr);
        self.contexts.bind(&bound.pat, Some(&bound.expr));
    }

    fn visit_expr_if_mut(&mut self, expr: &mut syn::ExprIf) {
        // `if let` binds its names for the `then` branch alone.
        self.contexts.enter();
        self.visit_expr_mut(&mut expr.cond);
        self.visit_block_mut(&mut expr.then_branch);
        self.contexts.leave();
        if let Some((_, otherwise)) = &mut expr.else_branch {
            self.visit_expr_mut(otherwise);
        }
    }

    fn visit_arm_mut(&mut self, arm: &mut syn::Arm) {
        self.contexts.enter();
        self.contexts.bind(&arm.pat, None);
        if let Some((_, guard)) = &mut arm.guard {
            self.visit_expr_mut(guard);
        }
        self.visit_expr_mut(&mut arm.body);
        self.contexts.leave();
    }

    fn visit_expr_for_loop_mut(&mut self, expr: &mut syn::ExprForLoop) {
        // The iterator is made once; the body runs once per item.
        self.visit_expr_mut(&mut expr.expr);
        let repeat = Repeat::For(single_binding(&expr.pat));
        self.contexts.enter();
        self.contexts.bind(&expr.pat, None);
        self.repeated(repeat, |this| this.visit_block_mut(&mut expr.body));
        self.contexts.leave();
    }

    fn visit_expr_while_mut(&mut self, expr: &mut syn::ExprWhile) {
        let bound = match unparenthesized(&expr.cond) {
            Expr::Let(bound) => single_binding(&bound.pat),
            _ => None,
        };
        self.contexts.enter();
        self.repeated(Repeat::While(bound), |this| {
            this.visit_expr_mut(&mut expr.cond);
            this.visit_block_mut(&mut expr.body);
        });
        self.contexts.leave();
    }

    fn visit_expr_loop_mut(&mut self, expr: &mut syn::ExprLoop) {
        self.repeated(Repeat::Loop, |this| this.visit_block_mut(&mut expr.body));
    }

    fn visit_expr_closure_mut(&mut self, closure: &mut syn::ExprClosure) {
        let bound = match closure.inputs.len() {
            1 => single_binding(&closure.inputs[0]),
            _ => None,
        };
        self.contexts.enter();
        for input in &closure.inputs {
            self.contexts.bind(input, None);
        }
        self.repeated(Repeat::Closure(bound), |this| {
            this.visit_expr_mut(&mut closure.body);
        });
        self.contexts.leave();
    }

    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        // `vec![..]`, `tokio::join!(..)`, `assert!(..)`: arguments that are expressions are
        // the body's code; other macros' tokens mean what their macro makes of them.
        if let Ok(mut arguments) =
            mac.parse_body_with(Punctuated::<Expr, syn::Token![,]>::parse_terminated)
        {
            let before = self.routed;
            for argument in &mut arguments {
                self.visit_expr_mut(argument);
            }
            if self.routed != before {
                mac.tokens = arguments.into_token_stream();
            }
        }
    }

    fn visit_item_mut(&mut self, _: &mut syn::Item) {
        // Items nested in the body are separate functions, with their own steps.
    }
}

#[cfg(test)]
mod tests;
