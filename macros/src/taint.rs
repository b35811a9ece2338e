//! Values that differ on every delivery, followed through the task's body: a local bound from a
//! generator (a UUID, the clock, a random number) carries it into every expression built from
//! the local, so that such a value cannot reach a nested call's key one step removed.
//!
//! What is followed: `let` bindings (with `else`, tuple and struct patterns, shadowing),
//! `if let`, `while let`, `match` and `for` bindings, closures defined in the body (calling one
//! that generates yields a generated value), and macros whose arguments are expressions
//! (`format!`, with its inline `{name}` captures). A name bound inside an expression (a
//! closure's parameter, a block's `let`, a `match` arm's or an `if let`'s pattern) hides the
//! outer local of that name there, as it does for rustc. A random number generator seeded from
//! a value (`StdRng::seed_from_u64(order_id)`) draws as fresh a value as its seed. What cannot
//! be followed: a value returned by a function defined elsewhere, whose body the attribute does
//! not see.

use std::iter;

use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Expr, Ident, Pat};

use crate::generators::{is_generator, is_seeded_construction};

/// Where a value that differs on every delivery comes from.
#[derive(Clone)]
pub(crate) struct Origin {
    /// The call or macro that makes the value.
    pub(crate) generator: Expr,
    /// The local the value reached the key through, when it did not come straight from the
    /// generator.
    pub(crate) binding: Option<Ident>,
}

/// A local in scope.
struct Binding {
    name: Ident,
    /// Where its value comes from, when it differs on every delivery.
    origin: Option<Origin>,
    /// Whether it holds a random number generator built from a seed (`origin` is the seed's):
    /// a draw from it is as fresh as the seed.
    seeded_rng: bool,
}

/// The locals in scope while the body is walked, innermost scope last; each carries a
/// generated value or is clean (a later clean binding hides an earlier tainted one).
#[derive(Default)]
pub(crate) struct Locals {
    scopes: Vec<Vec<Binding>>,
}

impl Locals {
    pub(crate) fn enter(&mut self) {
        self.scopes.push(Vec::new());
    }

    pub(crate) fn leave(&mut self) {
        self.scopes.pop();
    }

    /// Binds every name of `pat` in the innermost scope, carrying `origin` when the bound value
    /// is generated.
    pub(crate) fn bind(&mut self, pat: &Pat, origin: Option<&Origin>) {
        self.bind_as(pat, origin, false);
    }

    /// Binds every name of `pat` in the innermost scope to `value` (none for `let x;`): what
    /// it carries, and whether it is a seeded random number generator.
    pub(crate) fn bind_to(&mut self, pat: &Pat, value: Option<&Expr>) {
        let origin = value.and_then(|value| self.origin_of(value));
        let seeded_rng = value.is_some_and(|value| self.is_seeded_rng(value));
        self.bind_as(pat, origin.as_ref(), seeded_rng);
    }

    fn bind_as(&mut self, pat: &Pat, origin: Option<&Origin>, seeded_rng: bool) {
        let mut names = Names(Vec::new());
        names.visit_pat(pat);
        if self.scopes.is_empty() {
            self.enter();
        }
        let Some(scope) = self.scopes.last_mut() else {
            return;
        };
        for name in names.0 {
            let origin = origin.map(|origin| Origin {
                generator: origin.generator.clone(),
                binding: origin.binding.clone().or_else(|| Some(name.clone())),
            });
            scope.push(Binding {
                name,
                origin,
                seeded_rng,
            });
        }
    }

    /// Binds the parameters of `closure`, clean, in a new scope: they hide the outer locals of
    /// the same names in its body. The caller leaves the scope.
    pub(crate) fn enter_closure(&mut self, closure: &syn::ExprClosure) {
        self.enter();
        for input in &closure.inputs {
            self.bind(input, None);
        }
    }

    fn binding(&self, name: &Ident) -> Option<&Binding> {
        self.scopes
            .iter()
            .rev()
            .flat_map(|scope| scope.iter().rev())
            .find(|bound| bound.name == *name)
    }

    fn lookup(&self, name: &Ident) -> Option<&Origin> {
        self.binding(name).and_then(|bound| bound.origin.as_ref())
    }

    /// Whether `expr` is evidently a random number generator built from a seed: a seeded
    /// construction, or a local bound to one, borrowed, cloned or unwrapped.
    fn is_seeded_rng(&self, expr: &Expr) -> bool {
        match expr {
            Expr::Call(call) => is_seeded_construction(call),
            Expr::Path(path) if path.qself.is_none() => path
                .path
                .get_ident()
                .and_then(|name| self.binding(name))
                .is_some_and(|bound| bound.seeded_rng),
            Expr::MethodCall(call)
                if matches!(
                    call.method.to_string().as_str(),
                    "unwrap" | "expect" | "clone"
                ) =>
            {
                self.is_seeded_rng(&call.receiver)
            }
            Expr::Reference(reference) => self.is_seeded_rng(&reference.expr),
            Expr::Paren(paren) => self.is_seeded_rng(&paren.expr),
            Expr::Group(group) => self.is_seeded_rng(&group.expr),
            Expr::Try(try_) => self.is_seeded_rng(&try_.expr),
            _ => false,
        }
    }

    /// Input: a generator expression. Output: its operands, when it draws from a random number
    /// generator seeded in the body (`rng.random()`, `dist.sample(&mut rng)`,
    /// `Rng::random(&mut rng)`, `rand::seq::index::sample(&mut rng, ..)`).
    pub(crate) fn seeded_draw<'e>(&self, expr: &'e Expr) -> Option<Vec<&'e Expr>> {
        let operands: Vec<&Expr> = match expr {
            Expr::MethodCall(call) => iter::once(&*call.receiver).chain(&call.args).collect(),
            Expr::Call(call) => call.args.iter().collect(),
            _ => return None,
        };
        operands
            .iter()
            .any(|operand| self.is_seeded_rng(operand))
            .then_some(operands)
    }

    /// Input: an expression of the body. Output: where its generated value comes from, when
    /// its value is one: a generator, a local that carries one, or either passed through what
    /// keeps a value (a method chain on it, a field, `+`, `format!`, a reference, `?`,
    /// `.await`, a constructor, a block's or a branch's value, a closure defined here that
    /// makes one). A call of a function that merely takes the value as an argument does not
    /// carry it: a gateway's answer to a request stamped with a fresh id is not that id.
    pub(crate) fn origin_of(&mut self, expr: &Expr) -> Option<Origin> {
        if is_generator(expr) {
            return match self.seeded_draw(expr) {
                // A draw from a generator seeded here is as fresh as its seed.
                Some(operands) => operands
                    .into_iter()
                    .find_map(|operand| self.origin_of(operand)),
                None => Some(Origin {
                    generator: expr.clone(),
                    binding: None,
                }),
            };
        }
        match expr {
            Expr::Path(path) if path.qself.is_none() => path
                .path
                .get_ident()
                .and_then(|name| self.lookup(name))
                .cloned(),
            Expr::MethodCall(call) => self.origin_of(&call.receiver),
            Expr::Field(field) => self.origin_of(&field.base),
            Expr::Index(index) => self.origin_of(&index.expr),
            Expr::Binary(binary) => self
                .origin_of(&binary.left)
                .or_else(|| self.origin_of(&binary.right)),
            Expr::Unary(unary) => self.origin_of(&unary.expr),
            Expr::Reference(reference) => self.origin_of(&reference.expr),
            Expr::Paren(paren) => self.origin_of(&paren.expr),
            Expr::Group(group) => self.origin_of(&group.expr),
            Expr::Cast(cast) => self.origin_of(&cast.expr),
            Expr::Try(try_) => self.origin_of(&try_.expr),
            Expr::Await(awaited) => self.origin_of(&awaited.base),
            Expr::Closure(closure) => {
                self.enter_closure(closure);
                let origin = self.origin_of(&closure.body);
                self.leave();
                origin
            }
            Expr::Block(block) => self.tail(&block.block),
            Expr::Async(block) => self.tail(&block.block),
            Expr::Unsafe(block) => self.tail(&block.block),
            Expr::If(branch) => {
                self.enter();
                self.bind_condition(&branch.cond);
                let origin = self.tail(&branch.then_branch);
                self.leave();
                origin.or_else(|| {
                    branch
                        .else_branch
                        .as_ref()
                        .and_then(|(_, otherwise)| self.origin_of(otherwise))
                })
            }
            Expr::Match(matched) => matched.arms.iter().find_map(|arm| {
                self.enter();
                self.bind_to(&arm.pat, Some(&matched.expr));
                let origin = self.origin_of(&arm.body);
                self.leave();
                origin
            }),
            Expr::Tuple(tuple) => tuple.elems.iter().find_map(|elem| self.origin_of(elem)),
            Expr::Array(array) => array.elems.iter().find_map(|elem| self.origin_of(elem)),
            Expr::Struct(built) => built
                .fields
                .iter()
                .find_map(|field| self.origin_of(&field.expr)),
            Expr::Call(call) => self.called(call),
            Expr::Macro(mac) => self.macro_origin(&mac.mac),
            _ => None,
        }
    }

    /// A call carries a generated value when it calls a closure that makes one, or wraps one
    /// whole: a constructor (`Some(id)`, `Key(id)`), a conversion (`String::from(id)`) or a
    /// generator seeded from it (`StdRng::seed_from_u64(id)`).
    fn called(&mut self, call: &syn::ExprCall) -> Option<Origin> {
        let Expr::Path(path) = &*call.func else {
            return None;
        };
        if let Some(name) = path.path.get_ident()
            && let Some(origin) = self.lookup(name)
        {
            return Some(origin.clone());
        }
        let last = path.path.segments.last()?.ident.to_string();
        let wraps = last.starts_with(char::is_uppercase)
            || (path.path.segments.len() > 1 && matches!(last.as_str(), "from" | "new"))
            || is_seeded_construction(call);
        wraps
            .then(|| call.args.iter().find_map(|arg| self.origin_of(arg)))
            .flatten()
    }

    /// `format!` and its kind carry what their arguments and inline captures carry.
    fn macro_origin(&mut self, mac: &syn::Macro) -> Option<Origin> {
        let arguments = mac
            .parse_body_with(Punctuated::<Expr, syn::Token![,]>::parse_terminated)
            .ok()?;
        arguments.iter().find_map(|argument| {
            if let Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(format),
                ..
            }) = argument
            {
                captures(&format.value())
                    .iter()
                    .find_map(|name| self.lookup(&Ident::new(name, format.span())).cloned())
            } else {
                self.origin_of(argument)
            }
        })
    }

    /// The value of a block: its last expression, when it has no `;`, read with the block's
    /// own `let`s in scope.
    fn tail(&mut self, block: &syn::Block) -> Option<Origin> {
        self.enter();
        for stmt in &block.stmts {
            if let syn::Stmt::Local(local) = stmt {
                self.bind_to(&local.pat, local.init.as_ref().map(|init| &*init.expr));
            }
        }
        let origin = match block.stmts.last() {
            Some(syn::Stmt::Expr(expr, None)) => self.origin_of(expr),
            _ => None,
        };
        self.leave();
        origin
    }

    /// Binds what the `let`s of an `if` condition bind: `if let Some(id) = found && let ..`.
    fn bind_condition(&mut self, cond: &Expr) {
        match cond {
            Expr::Let(bound) => self.bind_to(&bound.pat, Some(&bound.expr)),
            Expr::Binary(both) if matches!(both.op, syn::BinOp::And(_)) => {
                self.bind_condition(&both.left);
                self.bind_condition(&both.right);
            }
            _ => {}
        }
    }

    /// Input: an expression. Output: the first generator anywhere inside it, the arguments of
    /// macros such as `format!` included, but for draws from a generator seeded in scope;
    /// closures' parameters and blocks' `let`s hide the locals of their names.
    pub(crate) fn first_generator(&mut self, expr: &Expr) -> Option<Expr> {
        let mut finder = Finder {
            locals: self,
            found: None,
        };
        finder.visit_expr(expr);
        finder.found
    }
}

/// The names a pattern binds.
struct Names(Vec<Ident>);

impl Visit<'_> for Names {
    fn visit_pat_ident(&mut self, pat: &syn::PatIdent) {
        self.0.push(pat.ident.clone());
        visit::visit_pat_ident(self, pat);
    }
}

/// Input: an expression outside the body (the attribute's key). Output: the first generator
/// anywhere inside it, the arguments of macros such as `format!` included.
pub(crate) fn first_generator(expr: &Expr) -> Option<Expr> {
    Locals::default().first_generator(expr)
}

/// Looks for the first generator in an expression, with the locals in scope.
struct Finder<'l> {
    locals: &'l mut Locals,
    found: Option<Expr>,
}

impl Visit<'_> for Finder<'_> {
    fn visit_expr(&mut self, expr: &Expr) {
        if self.found.is_some() {
            return;
        }
        if is_generator(expr) && self.locals.seeded_draw(expr).is_none() {
            self.found = Some(expr.clone());
            return;
        }
        if let Expr::Macro(mac) = expr
            && let Ok(arguments) = mac
                .mac
                .parse_body_with(Punctuated::<Expr, syn::Token![,]>::parse_terminated)
        {
            for argument in &arguments {
                self.visit_expr(argument);
            }
            return;
        }
        visit::visit_expr(self, expr);
    }

    fn visit_expr_closure(&mut self, closure: &syn::ExprClosure) {
        self.locals.enter_closure(closure);
        visit::visit_expr_closure(self, closure);
        self.locals.leave();
    }

    fn visit_block(&mut self, block: &syn::Block) {
        self.locals.enter();
        visit::visit_block(self, block);
        self.locals.leave();
    }

    fn visit_local(&mut self, local: &syn::Local) {
        visit::visit_local(self, local);
        self.locals
            .bind_to(&local.pat, local.init.as_ref().map(|init| &*init.expr));
    }
}

/// The names a format string captures inline: `name` in `{name}`, `{name:?}` or `{name:>8}`.
fn captures(format: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '{' => {
                let name: String = chars
                    .by_ref()
                    .take_while(|c| *c != '}' && *c != ':')
                    .collect();
                let name = name.trim();
                if name.starts_with(|c: char| c.is_alphabetic() || c == '_')
                    && name.chars().all(|c| c.is_alphanumeric() || c == '_')
                {
                    names.push(name.to_owned());
                }
            }
            _ => {}
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_every_generator_of_the_attributes_key_check() {
        for generator in [
            quote::quote!(uuid::Uuid::new_v4()),
            quote::quote!(Uuid::now_v7()),
            quote::quote!(rand::random::<u64>()),
            quote::quote!(rand::thread_rng()),
            quote::quote!(fastrand::u64(..)),
            quote::quote!(std::time::SystemTime::now()),
            quote::quote!(Instant::now()),
            quote::quote!(chrono::Utc::now()),
            quote::quote!(chrono::Local::now()),
            quote::quote!(std::process::id()),
        ] {
            let key: Expr = syn::parse_quote!(format!("receipt-{}", #generator));
            assert!(first_generator(&key).is_some(), "{generator}");
        }
    }

    #[test]
    fn a_generator_seeded_from_a_value_is_no_generator() {
        // Regression: every `rand::` path counted as a generator, seeded ones included.
        for seeded in [
            quote::quote!(rand::rngs::StdRng::seed_from_u64(order_id)),
            quote::quote!(StdRng::seed_from_u64(order_id)),
            quote::quote!(rand::SeedableRng::from_seed(seed)),
            quote::quote!(SeedableRng::from_seed(seed)),
            quote::quote!(rand::rngs::StdRng::seed_from_u64(order_id).random::<u64>()),
            quote::quote!(rand::rngs::SmallRng::from_rng(&mut StdRng::seed_from_u64(
                order_id
            ))),
            quote::quote!(fastrand::Rng::with_seed(order_id).u64(..)),
            quote::quote!(rand::distr::Uniform::new(1, 7)),
            quote::quote!(
                rand::distr::Uniform::new(1, 7)
                    .unwrap()
                    .sample(&mut StdRng::seed_from_u64(order_id))
            ),
        ] {
            let key: Expr = syn::parse_quote!(format!("receipt-{}", #seeded));
            assert!(first_generator(&key).is_none(), "{seeded}");
            assert!(Locals::default().origin_of(&key).is_none(), "{seeded}");
        }
        for entropy in [
            quote::quote!(rand::random::<u64>()),
            quote::quote!(rand::thread_rng().gen::<u64>()),
            quote::quote!(rand::rng().random::<u64>()),
            quote::quote!(rand::rngs::OsRng.try_next_u64()),
            quote::quote!(OsRng.next_u64()),
            quote::quote!(ThreadRng::default().random::<u64>()),
            quote::quote!(rand::rngs::StdRng::from_entropy().random::<u64>()),
            quote::quote!(StdRng::from_entropy()),
            quote::quote!(StdRng::from_os_rng()),
            quote::quote!(rand::make_rng::<StdRng>()),
            quote::quote!(StdRng::from_rng(&mut rand::rng())),
            quote::quote!(StdRng::seed_from_u64(rand::random())),
            quote::quote!(rng.random::<u64>()),
        ] {
            let key: Expr = syn::parse_quote!(format!("receipt-{}", #entropy));
            assert!(first_generator(&key).is_some(), "{entropy}");
            assert!(Locals::default().origin_of(&key).is_some(), "{entropy}");
        }
    }

    #[test]
    fn a_draw_from_a_seeded_local_is_as_fresh_as_its_seed() {
        let mut locals = Locals::default();
        locals.bind_to(
            &syn::parse_quote!(rng),
            Some(&syn::parse_quote!(StdRng::seed_from_u64(order_id))),
        );
        let drawn: Expr = syn::parse_quote!(format!("receipt-{}", rng.random::<u64>()));
        assert!(locals.first_generator(&drawn).is_none());
        assert!(locals.origin_of(&drawn).is_none());
        let sampled: Expr = syn::parse_quote!(dist.sample(&mut rng));
        assert!(locals.origin_of(&sampled).is_none());
        locals.bind_to(
            &syn::parse_quote!(seed),
            Some(&syn::parse_quote!(uuid::Uuid::new_v4().as_u64_pair().0)),
        );
        locals.bind_to(
            &syn::parse_quote!(fresh),
            Some(&syn::parse_quote!(StdRng::seed_from_u64(seed))),
        );
        let drawn: Expr = syn::parse_quote!(fresh.random::<u64>());
        let found = locals
            .origin_of(&drawn)
            .expect("seeded from a generated value");
        assert_eq!(found.binding.unwrap(), "seed");
    }

    #[test]
    fn a_closure_parameter_hides_an_outer_local() {
        // Regression: `|id| format!("x-{id}")` read the outer, generated `id`.
        let mut locals = Locals::default();
        locals.bind_to(
            &syn::parse_quote!(id),
            Some(&syn::parse_quote!(uuid::Uuid::new_v4())),
        );
        for hidden in [
            quote::quote!(|id| format!("x-{id}")),
            quote::quote!(|id: u64| format!("x-{}", id)),
            quote::quote!(|(id, _)| id.to_string()),
            quote::quote!(|n: u64| {
                let id = n * 2;
                format!("x-{id}")
            }),
            quote::quote!(match found {
                Some(id) => id.to_string(),
                None => String::new(),
            }),
            quote::quote!(if let Some(id) = found {
                id.to_string()
            } else {
                String::new()
            }),
        ] {
            let expr: Expr = syn::parse_quote!(#hidden);
            assert!(locals.origin_of(&expr).is_none(), "{hidden}");
        }
        for captured in [
            quote::quote!(|n: u64| format!("x-{id}-{n}")),
            quote::quote!(|other| format!("x-{id}-{other}")),
            quote::quote!(|n: u64| {
                let other = n;
                format!("x-{id}-{other}")
            }),
            quote::quote!(match found {
                Some(other) => format!("{id}{other}"),
                None => String::new(),
            }),
        ] {
            let expr: Expr = syn::parse_quote!(#captured);
            let found = locals
                .origin_of(&expr)
                .unwrap_or_else(|| panic!("{captured}"));
            assert_eq!(found.binding.unwrap(), "id");
        }
        // The closure's scope ends with it.
        assert!(locals.origin_of(&syn::parse_quote!(id)).is_some());
    }

    #[test]
    fn finds_the_inline_captures_of_a_format_string() {
        assert_eq!(
            captures("receipt-{key}-{{literal}}-{n:>8}-{0}-{}-{ spaced }"),
            ["key", "n", "spaced"]
        );
    }

    #[test]
    fn a_clean_rebinding_hides_a_generated_one() {
        let mut locals = Locals::default();
        let generated: Expr = syn::parse_quote!(uuid::Uuid::new_v4().to_string());
        let origin = locals.origin_of(&generated);
        locals.bind(&syn::parse_quote!(key), origin.as_ref());
        let through: Expr = syn::parse_quote!(format!("receipt-{key}"));
        let answered: Expr = syn::parse_quote!(gateway.charge(key.clone()).await);
        assert!(
            locals.origin_of(&answered).is_none(),
            "an answer to a call is not its argument"
        );
        let found = locals
            .origin_of(&through)
            .expect("tainted through the capture");
        assert_eq!(found.binding.unwrap(), "key");
        locals.enter();
        locals.bind(&syn::parse_quote!(key), None);
        assert!(locals.origin_of(&through).is_none());
        locals.leave();
        assert!(locals.origin_of(&through).is_some());
    }
}
