//! Values that differ on every delivery, followed through the task's body: a local bound from a
//! generator (a UUID, the clock, a random number) carries it into every expression built from
//! the local, so that such a value cannot reach a nested call's key one step removed.
//!
//! What is followed: `let` bindings (with `else`, tuple and struct patterns, shadowing),
//! `if let`, `while let`, `match` and `for` bindings, closures defined in the body (calling one
//! that generates yields a generated value), and macros whose arguments are expressions
//! (`format!`, with its inline `{name}` captures). What cannot be: a value returned by a
//! function defined elsewhere, whose body the attribute does not see.

use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Expr, Ident, Pat};

use crate::misuse::is_generator;

/// Where a value that differs on every delivery comes from.
#[derive(Clone)]
pub(crate) struct Origin {
    /// The call or macro that makes the value.
    pub(crate) generator: Expr,
    /// The local the value reached the key through, when it did not come straight from the
    /// generator.
    pub(crate) binding: Option<Ident>,
}

/// The locals in scope while the body is walked, innermost scope last; each carries a
/// generated value or is clean (a later clean binding hides an earlier tainted one).
#[derive(Default)]
pub(crate) struct Locals {
    scopes: Vec<Vec<(Ident, Option<Origin>)>>,
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
            scope.push((name, origin));
        }
    }

    fn lookup(&self, name: &Ident) -> Option<&Origin> {
        self.scopes
            .iter()
            .rev()
            .flat_map(|scope| scope.iter().rev())
            .find(|(bound, _)| bound == name)
            .and_then(|(_, origin)| origin.as_ref())
    }

    /// Input: an expression of the body. Output: where its generated value comes from, when
    /// its value is one: a generator, a local that carries one, or either passed through what
    /// keeps a value (a method chain on it, a field, `+`, `format!`, a reference, `?`,
    /// `.await`, a constructor, a block's or a branch's value, a closure defined here that
    /// makes one). A call of a function that merely takes the value as an argument does not
    /// carry it: a gateway's answer to a request stamped with a fresh id is not that id.
    pub(crate) fn origin_of(&self, expr: &Expr) -> Option<Origin> {
        if is_generator(expr) {
            return Some(Origin {
                generator: expr.clone(),
                binding: None,
            });
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
            Expr::Closure(closure) => self.origin_of(&closure.body),
            Expr::Block(block) => self.tail(&block.block),
            Expr::Async(block) => self.tail(&block.block),
            Expr::Unsafe(block) => self.tail(&block.block),
            Expr::If(branch) => self.tail(&branch.then_branch).or_else(|| {
                branch
                    .else_branch
                    .as_ref()
                    .and_then(|(_, otherwise)| self.origin_of(otherwise))
            }),
            Expr::Match(matched) => matched
                .arms
                .iter()
                .find_map(|arm| self.origin_of(&arm.body)),
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
    /// whole: a constructor (`Some(id)`, `Key(id)`) or a conversion (`String::from(id)`).
    fn called(&self, call: &syn::ExprCall) -> Option<Origin> {
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
            || (path.path.segments.len() > 1 && matches!(last.as_str(), "from" | "new"));
        wraps
            .then(|| call.args.iter().find_map(|arg| self.origin_of(arg)))
            .flatten()
    }

    /// `format!` and its kind carry what their arguments and inline captures carry.
    fn macro_origin(&self, mac: &syn::Macro) -> Option<Origin> {
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

    /// The value of a block: its last expression, when it has no `;`.
    fn tail(&self, block: &syn::Block) -> Option<Origin> {
        match block.stmts.last()? {
            syn::Stmt::Expr(expr, None) => self.origin_of(expr),
            _ => None,
        }
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

/// Input: an expression. Output: the first generator anywhere inside it, the arguments of
/// macros such as `format!` included.
pub(crate) fn first_generator(expr: &Expr) -> Option<Expr> {
    struct Finder(Option<Expr>);
    impl Visit<'_> for Finder {
        fn visit_expr(&mut self, expr: &Expr) {
            if self.0.is_some() {
                return;
            }
            if is_generator(expr) {
                self.0 = Some(expr.clone());
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
    }
    let mut finder = Finder(None);
    finder.visit_expr(expr);
    finder.0
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
