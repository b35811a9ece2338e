//! Which names of the body hold the task's context, so that steps are told by their receiver:
//! `ctx.step(..)` is a step when `ctx` was bound to `idempotask::context()` (unwrapped), to a
//! clone or a reference of such a binding, and nothing has shadowed it since.
//!
//! A context is followed only where the body binds it: a parameter of a closure or of a helper
//! function is a name like any other, since its type is the type system's to know.

use syn::visit::{self, Visit};
use syn::{Expr, Pat, Path};

/// The names bound in the scopes around the expression being walked, innermost last, each
/// with whether it holds the task's context.
pub(crate) struct Contexts<'a> {
    /// The `crate = path` option, when the attribute names the runtime another way.
    krate: Option<&'a Path>,
    bound: Vec<(String, bool)>,
    scopes: Vec<usize>,
}

impl<'a> Contexts<'a> {
    pub(crate) fn new(krate: Option<&'a Path>) -> Self {
        Self {
            krate,
            bound: Vec::new(),
            scopes: Vec::new(),
        }
    }

    /// Opens a scope: names bound until [`leave`](Self::leave) are forgotten then.
    pub(crate) fn enter(&mut self) {
        self.scopes.push(self.bound.len());
    }

    pub(crate) fn leave(&mut self) {
        if let Some(len) = self.scopes.pop() {
            self.bound.truncate(len);
        }
    }

    /// Input: a pattern and the expression it is bound to, if known. Output: its names bound in
    /// the current scope, as the context when the pattern is one name (or `Some(name)` of an
    /// `Option`) and the expression is a context.
    pub(crate) fn bind(&mut self, pat: &Pat, init: Option<&Expr>) {
        let context = init.and_then(|init| self.context_binding(pat, init));
        for name in names(pat) {
            let holds = context.as_ref() == Some(&name);
            self.bound.push((name, holds));
        }
    }

    /// The one name of `pat` that receives a context from `init`: `ctx` in `let ctx =
    /// idempotask::context().expect(..)` and in `let Some(ctx) = idempotask::context() else ..`.
    fn context_binding(&self, pat: &Pat, init: &Expr) -> Option<String> {
        let pat = match pat {
            Pat::Type(typed) => &*typed.pat,
            other => other,
        };
        match pat {
            Pat::Ident(ident) if ident.subpat.is_none() && self.is_context(init) => {
                Some(ident.ident.to_string())
            }
            Pat::TupleStruct(some)
                if some.path.is_ident("Some")
                    && some.elems.len() == 1
                    && self.is_context_option(init) =>
            {
                match &some.elems[0] {
                    Pat::Ident(ident) if ident.subpat.is_none() => Some(ident.ident.to_string()),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Whether `expr` evaluates to the task's context (or a reference to it): a binding that
    /// holds it, its clone, or `idempotask::context()` unwrapped.
    pub(crate) fn is_context(&self, expr: &Expr) -> bool {
        match unwrapped(expr) {
            Expr::Path(path) if path.qself.is_none() => path.path.get_ident().is_some_and(|name| {
                self.bound
                    .iter()
                    .rev()
                    .find(|(bound, _)| name == bound)
                    .is_some_and(|(_, holds)| *holds)
            }),
            Expr::Reference(reference) => self.is_context(&reference.expr),
            Expr::MethodCall(call) if call.method == "clone" && call.args.is_empty() => {
                self.is_context(&call.receiver)
            }
            Expr::MethodCall(call)
                if (call.method == "expect" && call.args.len() == 1)
                    || (call.method == "unwrap" && call.args.is_empty()) =>
            {
                self.is_context_option(&call.receiver)
            }
            Expr::Try(tried) => {
                self.is_context_option(&tried.expr) || self.is_context_result(&tried.expr)
            }
            _ => false,
        }
    }

    /// Whether `expr` is `idempotask::context()`, the `Option` of the context.
    fn is_context_option(&self, expr: &Expr) -> bool {
        let Expr::Call(call) = unwrapped(expr) else {
            return false;
        };
        let Expr::Path(function) = unwrapped(&call.func) else {
            return false;
        };
        call.args.is_empty() && function.qself.is_none() && self.is_ours(&function.path)
    }

    /// Whether `expr` is `idempotask::context().ok_or(..)` or `.ok_or_else(..)`.
    fn is_context_result(&self, expr: &Expr) -> bool {
        match unwrapped(expr) {
            Expr::MethodCall(call)
                if (call.method == "ok_or" || call.method == "ok_or_else")
                    && call.args.len() == 1 =>
            {
                self.is_context_option(&call.receiver)
            }
            _ => false,
        }
    }

    /// Whether `path` is the runtime's `context` function: `idempotask::context`, or `context`
    /// under the path that `crate = ..` gives.
    fn is_ours(&self, path: &Path) -> bool {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let Some((last, runtime)) = segments.split_last() else {
            return false;
        };
        if last != "context" || path.segments.iter().any(|s| !s.arguments.is_none()) {
            return false;
        }
        runtime == ["idempotask"]
            || self.krate.is_some_and(|krate| {
                krate.leading_colon.is_some() == path.leading_colon.is_some()
                    && krate.segments.len() == runtime.len()
                    && krate
                        .segments
                        .iter()
                        .zip(runtime)
                        .all(|(a, b)| a.ident == b)
            })
    }
}

/// `(expr)` and the invisible groups of macro arguments are what they hold.
pub(crate) fn unwrapped(mut expr: &Expr) -> &Expr {
    loop {
        match expr {
            Expr::Paren(paren) => expr = &paren.expr,
            Expr::Group(group) => expr = &group.expr,
            _ => return expr,
        }
    }
}

/// The names `pat` binds.
pub(crate) fn names(pat: &Pat) -> Vec<String> {
    struct Names(Vec<String>);
    impl Visit<'_> for Names {
        fn visit_pat_ident(&mut self, pat: &syn::PatIdent) {
            self.0.push(pat.ident.to_string());
            visit::visit_pat_ident(self, pat);
        }
    }
    let mut names = Names(Vec::new());
    names.visit_pat(pat);
    names.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound(contexts: &mut Contexts<'_>, statement: syn::Stmt) {
        let syn::Stmt::Local(local) = statement else {
            panic!("not a `let`");
        };
        let init = local.init.as_ref().map(|init| &*init.expr);
        contexts.bind(&local.pat, init);
    }

    fn is_context(contexts: &Contexts<'_>, expr: &Expr) -> bool {
        contexts.is_context(expr)
    }

    #[test]
    fn follows_the_context_through_bindings_clones_and_references() {
        let mut contexts = Contexts::new(None);
        bound(
            &mut contexts,
            syn::parse_quote!(let ctx = idempotask::context().expect("task");),
        );
        bound(&mut contexts, syn::parse_quote!(let copy = ctx.clone();));
        bound(
            &mut contexts,
            syn::parse_quote!(let borrowed: &TaskContext = &copy;),
        );
        bound(
            &mut contexts,
            syn::parse_quote!(let Some(other) = ::idempotask::context() else { return };),
        );
        bound(
            &mut contexts,
            syn::parse_quote!(let counter = Counter::new();),
        );
        for (expr, expected) in [
            (syn::parse_quote!(ctx), true),
            (syn::parse_quote!(copy), true),
            (syn::parse_quote!(borrowed), true),
            (syn::parse_quote!(other), true),
            (syn::parse_quote!((&ctx)), true),
            (syn::parse_quote!(idempotask::context().unwrap()), true),
            (syn::parse_quote!(idempotask::context()?), true),
            (
                syn::parse_quote!(idempotask::context().ok_or(Error::NotConfigured)?),
                true,
            ),
            (syn::parse_quote!(counter), false),
            (syn::parse_quote!(context().unwrap()), false),
            (syn::parse_quote!(other::context().unwrap()), false),
            (syn::parse_quote!(idempotask::context()), false),
            (syn::parse_quote!(self.ctx), false),
        ] {
            let expr: Expr = expr;
            assert_eq!(
                is_context(&contexts, &expr),
                expected,
                "{}",
                quote::quote!(#expr)
            );
        }
    }

    #[test]
    fn a_shadowing_binding_ends_the_context_until_its_scope_ends() {
        let mut contexts = Contexts::new(None);
        let ctx: Expr = syn::parse_quote!(ctx);
        bound(
            &mut contexts,
            syn::parse_quote!(let ctx = idempotask::context().unwrap();),
        );
        contexts.enter();
        bound(
            &mut contexts,
            syn::parse_quote!(let ctx = Simulation::new();),
        );
        assert!(!is_context(&contexts, &ctx));
        contexts.leave();
        assert!(is_context(&contexts, &ctx));
    }

    #[test]
    fn the_crate_option_names_the_runtime() {
        let krate: Path = syn::parse_quote!(::my_app::idempotask);
        let mut contexts = Contexts::new(Some(&krate));
        bound(
            &mut contexts,
            syn::parse_quote!(let a = ::my_app::idempotask::context().unwrap();),
        );
        bound(
            &mut contexts,
            syn::parse_quote!(let b = my_app::idempotask::context().unwrap();),
        );
        assert!(is_context(&contexts, &syn::parse_quote!(a)));
        assert!(!is_context(&contexts, &syn::parse_quote!(b)));
    }
}
