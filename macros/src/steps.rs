//! Steps as written in the task's body: `ctx.step(name, effect)`, whose recorded values a rerun
//! matches by their place and their name, so each name must be known here and tell its step
//! apart from the body's others.
//!
//! A step is any two-argument method call named `step`, whatever its receiver is called: the
//! context can be bound to any name, cloned into closures, or fetched on the spot. A body calls
//! another type's `step` as `Type::step(&value, ..)` to keep it out of these checks. The body
//! of a nested call run in place (`TASK.call(key).run(async { .. })`) has a journal of its own,
//! so its steps are checked as a body apart.

use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Block, Expr, LitStr};

use crate::args::Errors;

/// Input: the task's body. Output: an error for each step whose name is not a literal (or a
/// literal with a key part), each literal name given to two steps, and each step without a key
/// part that can run more than once (in a loop or a closure).
pub(crate) fn check_body(body: &Block, errors: &mut Errors) {
    let mut checker = StepChecker {
        errors,
        repeated: Vec::new(),
        names: Vec::new(),
    };
    checker.visit_block(body);
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
    struct Names(Vec<String>);
    impl Visit<'_> for Names {
        fn visit_pat_ident(&mut self, pat: &syn::PatIdent) {
            self.0.push(pat.ident.to_string());
            visit::visit_pat_ident(self, pat);
        }
    }
    let mut names = Names(Vec::new());
    names.visit_pat(pat);
    match <[String; 1]>::try_from(names.0) {
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

/// `("charge")` and the invisible groups of macro arguments are what they hold.
fn unparenthesized(mut expr: &Expr) -> &Expr {
    loop {
        match expr {
            Expr::Paren(paren) => expr = &paren.expr,
            Expr::Group(group) => expr = &group.expr,
            _ => return expr,
        }
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
    /// The loops and closures around the expression being walked, innermost last.
    repeated: Vec<Repeat>,
    /// The literal names of the body's steps that run once, with where each is first given.
    names: Vec<(String, Span)>,
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

/// Whether `call` is one of `TaskContext`'s step methods, by its name and its number of
/// arguments: `step` and `step_or_hold` (name, effect), `step_or_reconcile` (name, reconcile,
/// effect).
fn is_step_call(call: &syn::ExprMethodCall) -> bool {
    match call.args.len() {
        2 => call.method == "step" || call.method == "step_or_hold",
        3 => call.method == "step_or_reconcile",
        _ => false,
    }
}

impl<'ast> Visit<'ast> for StepChecker<'_> {
    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if is_step_call(call) {
            self.check_name(&call.args[0]);
        } else if (call.method == "run" || call.method == "run_reported")
            && is_nested_call(&call.receiver)
        {
            // A nested unit's body runs once per its own key, and records its own journal.
            self.visit_expr(&call.receiver);
            let outer = (
                std::mem::take(&mut self.repeated),
                std::mem::take(&mut self.names),
            );
            for arg in &call.args {
                self.visit_expr(arg);
            }
            (self.repeated, self.names) = outer;
            return;
        }
        visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_for_loop(&mut self, expr: &'ast syn::ExprForLoop) {
        // The iterator is made once; the body runs once per item.
        self.visit_expr(&expr.expr);
        let repeat = Repeat::For(single_binding(&expr.pat));
        self.repeated(repeat, |this| this.visit_block(&expr.body));
    }

    fn visit_expr_while(&mut self, expr: &'ast syn::ExprWhile) {
        let bound = match unparenthesized(&expr.cond) {
            Expr::Let(bound) => single_binding(&bound.pat),
            _ => None,
        };
        self.repeated(Repeat::While(bound), |this| {
            this.visit_expr(&expr.cond);
            this.visit_block(&expr.body);
        });
    }

    fn visit_expr_loop(&mut self, expr: &'ast syn::ExprLoop) {
        self.repeated(Repeat::Loop, |this| this.visit_block(&expr.body));
    }

    fn visit_expr_closure(&mut self, closure: &'ast syn::ExprClosure) {
        let bound = match closure.inputs.len() {
            1 => single_binding(&closure.inputs[0]),
            _ => None,
        };
        self.repeated(Repeat::Closure(bound), |this| {
            this.visit_expr(&closure.body);
        });
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // `vec![..]`, `tokio::join!(..)`, `assert!(..)`: arguments that are expressions are
        // the body's code; other macros' tokens mean what their macro makes of them.
        if let Ok(arguments) =
            mac.parse_body_with(Punctuated::<Expr, syn::Token![,]>::parse_terminated)
        {
            for argument in &arguments {
                self.visit_expr(argument);
            }
        }
    }

    fn visit_item(&mut self, _: &'ast syn::Item) {
        // Items nested in the body are separate functions, with their own steps.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages' first lines for `body`, in the order they are reported.
    fn errors(body: &Block) -> Vec<String> {
        let mut errors = Errors::default();
        check_body(body, &mut errors);
        errors.into_result().map_or_else(
            |err| {
                err.into_iter()
                    .map(|err| err.to_string().lines().next().unwrap_or("").to_owned())
                    .collect()
            },
            |()| Vec::new(),
        )
    }

    #[test]
    fn accepts_literals_and_key_parts() {
        let body: Block = syn::parse_quote!({
            let ctx = idempotask::context().unwrap();
            let charge = ctx.step("charge", charge()).await?;
            ctx.step(("retry"), again()).await?;
            for recipient in &recipients {
                ctx.step(("mail", recipient), mail(recipient)).await?;
            }
            let sent = recipients
                .iter()
                .map(|r| async move { ctx.step(("sms", r.id), sms(r)).await });
            if charge > 0 {
                ctx.step("refund", refund()).await?;
            } else {
                ctx.step("receipt", receipt()).await?;
            }
            // Not steps: another arity, or another type's `step` called as a path.
            for n in 0..3 {
                counter.step(n);
                Sim::step(&mut sim, n, input);
            }
        });
        assert_eq!(errors(&body), Vec::<String>::new());
    }

    #[test]
    fn refuses_names_that_are_not_literals() {
        let body: Block = syn::parse_quote!({
            ctx.step(name, a()).await?;
            ctx.step(format!("charge-{id}"), b()).await?;
            ctx.step(NAMES::CHARGE, c()).await?;
            ctx.step((name, id), d()).await?;
            ctx.step(("a", id, more), e()).await?;
            idempotask::context()
                .unwrap()
                .step(String::from("x"), f())
                .await?;
        });
        let found = errors(&body);
        assert_eq!(found.len(), 6, "{found:?}");
        assert!(
            found
                .iter()
                .all(|message| message.starts_with("a step's name must be a string literal"))
        );
    }

    #[test]
    fn refuses_a_literal_name_given_twice() {
        let body: Block = syn::parse_quote!({
            ctx.step("charge", a()).await?;
            if paid {
                ctx.step("mail", b()).await?;
            } else {
                ctx.step("charge", c()).await?;
            }
            ctx.step(("charge", 2), d()).await?;
            ctx.step("mail", e()).await?;
        });
        assert_eq!(
            errors(&body),
            [
                "two steps of this body are named `charge`",
                "two steps of this body are named `mail`"
            ]
        );
    }

    #[test]
    fn refuses_a_step_without_a_key_part_that_can_run_more_than_once() {
        let body: Block = syn::parse_quote!({
            for item in ctx.step("list", list()).await? {
                ctx.step("mail", mail(item)).await?;
            }
            while let Some(next) = ctx.step("next", next()).await? {}
            loop {
                ctx.step("poll", poll()).await?;
                break;
            }
            let mails = items
                .iter()
                .map(|item| async move { ctx.step("sms", sms(item)).await });
            let later = async || ctx.step("later", later()).await;
            tokio::join!(ctx.step("joined", a()), async {
                vec![ctx.step("fine", b())]
            });
        });
        let found = errors(&body);
        let repeated: Vec<_> = found
            .iter()
            .filter(|message| message.starts_with("a step that can run more than once"))
            .collect();
        assert_eq!(repeated.len(), 5, "{found:?}");
        assert_eq!(
            found.len(),
            5,
            "`list`, `joined` and `fine` run once: {found:?}"
        );
    }

    #[test]
    fn the_help_names_the_key_part_a_loop_or_closure_binds() {
        let body: Block = syn::parse_quote!({
            for recipient in &recipients {
                ctx.step("mail", mail(recipient)).await?;
            }
            while let Some(job) = queue.pop() {
                ctx.step("job", run(job)).await?;
            }
            let sms = |phone: &str| ctx.step("sms", sms(phone));
            for (place, recipient) in recipients.iter().enumerate() {
                ctx.step("fax", fax(place, recipient)).await?;
            }
        });
        let mut errors = Errors::default();
        check_body(&body, &mut errors);
        let helps: Vec<String> = errors
            .into_result()
            .unwrap_err()
            .into_iter()
            .filter_map(|err| {
                let message = err.to_string();
                let help = message.lines().find(|line| line.starts_with("= help:"))?;
                Some(help.rsplit('`').nth(1)?.to_owned())
            })
            .collect();
        assert_eq!(
            helps,
            [
                "(\"mail\", recipient)",
                "(\"job\", job)",
                "(\"sms\", phone)",
                "(\"fax\", item)"
            ]
        );
    }

    #[test]
    fn a_nested_units_body_has_steps_of_its_own() {
        let body: Block = syn::parse_quote!({
            ctx.step("charge", a()).await?;
            for order in orders {
                RECEIPT
                    .call(format!("receipt-{order}"))
                    .store(store.clone())
                    .run(async { idempotask::context().unwrap().step("charge", b()).await })
                    .await?;
            }
            ctx.step("mail", c()).await?;
            ctx.step("mail", d()).await?;
        });
        assert_eq!(errors(&body), ["two steps of this body are named `mail`"]);
    }

    #[test]
    fn a_nested_function_is_not_the_body() {
        let body: Block = syn::parse_quote!({
            ctx.step("charge", a()).await?;
            fn helper(ctx: &TaskContext) {
                ctx.step("charge", b());
            }
        });
        assert_eq!(errors(&body), Vec::<String>::new());
    }
}
