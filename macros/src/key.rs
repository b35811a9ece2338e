//! The key: a template or a parameter, checked to come from the caller and stay as it came.
//!
//! Input: the `key` (and `fingerprint`) options and the function. Output: the expression that
//! builds the key string from borrowed arguments, or every misuse found: a generated key, a
//! placeholder that names no parameter, a key parameter that is `mut`, rebound or assigned.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::visit::{self, Visit};
use syn::{Block, Expr, FnArg, Ident, ItemFn, LitStr, Local, Pat, Type};

use crate::args::Errors;
use crate::shape::Move;
use crate::suggest::did_you_mean;

/// Calls whose result differs on every delivery, by their path's last segment.
const GENERATOR_FUNCTIONS: &[&str] = &[
    "new_v1",
    "new_v4",
    "new_v6",
    "new_v7",
    "now_v1",
    "now_v6",
    "now_v7",
    "new_random",
    "random",
    "random_range",
    "thread_rng",
    "rng",
    "gen_range",
    "now",
    "now_utc",
    "now_local",
    "elapsed",
];

/// Types whose `new()` or `generate()` mints a fresh identifier.
const GENERATOR_TYPES: &[&str] = &[
    "Ulid",
    "Xid",
    "Ksuid",
    "Cuid",
    "Nanoid",
    "ObjectId",
    "Snowflake",
];

/// Macros that mint fresh identifiers.
const GENERATOR_MACROS: &[&str] = &["nanoid", "cuid", "ulid"];

/// Methods that draw random values.
const GENERATOR_METHODS: &[&str] = &["gen", "random", "random_range", "gen_range", "sample"];

/// A parameter the key or fingerprint can name.
pub(crate) struct Param {
    pub(crate) ident: Ident,
    /// `mut` in the pattern, if any.
    pub(crate) mutability: Option<Span>,
    /// `&mut` in the type, if any.
    pub(crate) mut_ref: Option<Span>,
}

/// Input: the function and async-trait's moves of its arguments, if any. Output: its named
/// parameters, `self` included for methods, each with the `mut` it was declared with; for a
/// by-value parameter async-trait moved that `mut` onto its binding in the body.
pub(crate) fn params(function: &ItemFn, moves: &[Move<'_>]) -> Vec<Param> {
    let mut params: Vec<Param> = function
        .sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Receiver(receiver) => Some(Param {
                ident: Ident::new("self", receiver.self_token.span),
                mutability: receiver.mutability.map(|m| m.span),
                mut_ref: receiver
                    .reference
                    .as_ref()
                    .and(receiver.mutability.map(|m| m.span)),
            }),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(pat) => Some(Param {
                    ident: pat.ident.clone(),
                    mutability: pat.mutability.map(|m| m.span),
                    mut_ref: match &*typed.ty {
                        Type::Reference(reference) => reference.mutability.map(|m| m.span),
                        _ => None,
                    },
                }),
                _ => None,
            },
        })
        .collect();
    for moved in moves {
        let Some(span) = moved.mutability else {
            continue;
        };
        // `&mut self` is moved into `let mut __self`: that `mut` is the reference's, which
        // the signature still shows.
        if let Some(param) = params
            .iter_mut()
            .find(|p| p.ident == moved.param && p.mut_ref.is_none())
        {
            param.mutability.get_or_insert(span);
        }
    }
    params
}

/// The checked key: how to build it, and which parameters it reads.
pub(crate) struct Key {
    /// An expression of type `String`, reading the arguments by reference.
    pub(crate) build: TokenStream,
    /// The parameters the key is made of.
    pub(crate) roots: Vec<Ident>,
}

/// Input: the `key` option. Output: the key, or every mistake in it.
pub(crate) fn key(value: &Expr, params: &[Param], errors: &mut Errors) -> Option<Key> {
    if let Some(generated) = first_generator(value) {
        errors.push(generated_key(generated));
        return None;
    }
    match value {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(template),
            ..
        }) => template_key(template, params, errors),
        Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some() => {
            let ident = path.path.get_ident()?;
            let param = find_param(ident, params, errors)?;
            let ident = param.ident.clone();
            let build = quote_spanned! {ident.span()=>
                ::idempotask::__private::key_from(&#ident)
            };
            Some(Key {
                build,
                roots: vec![ident],
            })
        }
        other => {
            errors.spanned(
                other,
                "expected a key template like `\"order-charge-{order_id}\"` or a parameter name like `idempotency_key`",
            );
            None
        }
    }
}

/// `"order-{order.id}-{attempt}"`: literal text with `{expression}` placeholders (`{{`, `}}`
/// escape braces), each expression rooted at a parameter.
fn template_key(template: &LitStr, params: &[Param], errors: &mut Errors) -> Option<Key> {
    let text = template.value();
    let span = template.span();
    let mut format = String::new();
    let mut arguments = Vec::new();
    let mut roots = Vec::new();
    let mut chars = text.chars().peekable();
    let mut ok = true;
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                format.push_str("{{");
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                format.push_str("}}");
            }
            '{' => {
                let mut inner = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == '}' {
                        closed = true;
                        break;
                    }
                    inner.push(c);
                }
                if !closed {
                    errors.at(
                        span,
                        "unclosed `{` in the key template; write `{{` for a literal brace",
                    );
                    return None;
                }
                match placeholder(&inner, span, params, errors) {
                    Some((expr, root)) => {
                        format.push_str("{}");
                        arguments.push(expr);
                        roots.push(root);
                    }
                    None => ok = false,
                }
            }
            '}' => {
                errors.at(
                    span,
                    "unmatched `}` in the key template; write `}}` for a literal brace",
                );
                return None;
            }
            other => format.push(other),
        }
    }
    if !ok {
        return None;
    }
    if arguments.is_empty() {
        errors.at(
            span,
            "the key template names no parameter, so every call would share one key; add a placeholder like `{order_id}`",
        );
        return None;
    }
    let format = LitStr::new(&format, span);
    Some(Key {
        build: quote_spanned! {span=> ::idempotask::__private::format!(#format, #(#arguments),*) },
        roots,
    })
}

/// One placeholder's expression, spanned at the template and rooted at a parameter.
fn placeholder(
    inner: &str,
    span: Span,
    params: &[Param],
    errors: &mut Errors,
) -> Option<(Expr, Ident)> {
    let inner = inner.trim();
    if inner.is_empty() {
        errors.at(
            span,
            "empty placeholder `{}` in the key template; name a parameter, like `{order_id}`",
        );
        return None;
    }
    let parsed = inner
        .parse::<TokenStream>()
        .ok()
        .map(|tokens| respan(tokens, span))
        .and_then(|tokens| syn::parse2::<Expr>(tokens).ok());
    let Some(expr) = parsed else {
        errors.at(
            span,
            format!("`{{{inner}}}` is not an expression; placeholders name a parameter or its fields, like `{{order.id}}`"),
        );
        return None;
    };
    if first_generator(&expr).is_some() {
        errors.push(generated_key(&expr));
        return None;
    }
    let Some(root) = root_ident(&expr) else {
        errors.at(
            span,
            format!("placeholder `{{{inner}}}` must start from a parameter, like `{{order.id}}`"),
        );
        return None;
    };
    let param = find_param(&Ident::new(&root.to_string(), span), params, errors)?;
    Some((expr, param.ident.clone()))
}

/// The parameter named `ident`, or an error with a suggestion.
fn find_param<'p>(ident: &Ident, params: &'p [Param], errors: &mut Errors) -> Option<&'p Param> {
    if let Some(param) = params.iter().find(|p| p.ident == *ident) {
        return Some(param);
    }
    let names: Vec<String> = params.iter().map(|p| p.ident.to_string()).collect();
    let hint = did_you_mean(&ident.to_string(), names.iter().map(String::as_str))
        .map_or_else(String::new, |close| format!("; did you mean `{close}`?"));
    errors.at(
        ident.span(),
        format!("`{ident}` is not a parameter of this function{hint}"),
    );
    None
}

/// The identifier an expression like `order.id` or `order.id()` starts from.
fn root_ident(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Path(path) if path.qself.is_none() => path.path.get_ident(),
        Expr::Field(field) => root_ident(&field.base),
        Expr::MethodCall(call) => root_ident(&call.receiver),
        Expr::Reference(reference) => root_ident(&reference.expr),
        Expr::Paren(paren) => root_ident(&paren.expr),
        _ => None,
    }
}

fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
}

fn generated_key(at: &dyn ToTokens) -> syn::Error {
    syn::Error::new_spanned(
        at,
        "the idempotency key must be supplied by the caller, not generated inside the task\n\
         = note: a value made on each delivery differs between deliveries, so a duplicate is never recognised\n\
         = help: take the key as a parameter, decided where the business decision is made: `key = \"order-charge-{order_id}\"`",
    )
}

/// The first sub-expression that mints a fresh value (a UUID, a random number, the clock).
pub(crate) fn first_generator(expr: &Expr) -> Option<&Expr> {
    struct Finder<'e> {
        found: Option<&'e Expr>,
    }
    impl<'e> Visit<'e> for Finder<'e> {
        fn visit_expr(&mut self, expr: &'e Expr) {
            if self.found.is_some() {
                return;
            }
            if is_generator(expr) {
                self.found = Some(expr);
                return;
            }
            visit::visit_expr(self, expr);
        }
    }
    let mut finder = Finder { found: None };
    finder.visit_expr(expr);
    finder.found
}

fn is_generator(expr: &Expr) -> bool {
    match expr {
        Expr::Call(call) => {
            let Expr::Path(path) = &*call.func else {
                return false;
            };
            let segments: Vec<String> = path
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            let Some(last) = segments.last() else {
                return false;
            };
            GENERATOR_FUNCTIONS.contains(&last.as_str())
                || (matches!(last.as_str(), "new" | "generate" | "from_entropy")
                    && segments
                        .iter()
                        .rev()
                        .nth(1)
                        .is_some_and(|ty| GENERATOR_TYPES.contains(&ty.as_str())))
        }
        Expr::Macro(mac) => mac
            .mac
            .path
            .segments
            .last()
            .is_some_and(|s| GENERATOR_MACROS.contains(&s.ident.to_string().as_str())),
        Expr::MethodCall(call) => GENERATOR_METHODS.contains(&call.method.to_string().as_str()),
        _ => false,
    }
}

/// Input: the task's body, the key's parameters, the statements that are not the user's
/// (async-trait's moves of the arguments) and whether the body names the receiver `__self`
/// (async-trait renames it). Output: an error for each place where the body rebinds, assigns
/// or mutably borrows a key parameter, or builds a generated key for the idempotask API.
pub(crate) fn check_body(
    body: &Block,
    roots: &[Ident],
    not_users: &[&Local],
    self_renamed: bool,
    errors: &mut Errors,
) {
    let mut checker = BodyChecker {
        roots,
        not_users,
        self_renamed,
        errors,
    };
    checker.visit_block(body);
}

struct BodyChecker<'a> {
    roots: &'a [Ident],
    not_users: &'a [&'a Local],
    self_renamed: bool,
    errors: &'a mut Errors,
}

impl BodyChecker<'_> {
    /// The key parameter an assignable place like `key`, `key.field` or `key[0]` belongs to.
    fn key_root(&self, expr: &Expr) -> Option<Ident> {
        match expr {
            Expr::Path(path) => {
                let ident = path.path.get_ident()?;
                let ident = if self.self_renamed && ident == "__self" {
                    Ident::new("self", ident.span())
                } else {
                    ident.clone()
                };
                self.roots.contains(&ident).then_some(ident)
            }
            Expr::Field(field) => self.key_root(&field.base),
            Expr::Index(index) => self.key_root(&index.expr),
            Expr::Paren(paren) => self.key_root(&paren.expr),
            _ => None,
        }
    }

    fn assigned(&mut self, place: &Expr) {
        if let Some(ident) = self.key_root(place) {
            self.errors.spanned(
                place,
                format!("cannot assign to the key parameter `{ident}`: the key is the caller's and fixed before the body runs"),
            );
        }
    }

    fn generated_arguments<'e>(&mut self, args: impl IntoIterator<Item = &'e Expr>) {
        for arg in args {
            if let Some(generated) = first_generator(arg) {
                self.errors.push(generated_key(generated));
            }
        }
    }
}

impl<'ast> Visit<'ast> for BodyChecker<'_> {
    fn visit_local(&mut self, local: &'ast Local) {
        if !self.not_users.iter().any(|not| std::ptr::eq(*not, local)) {
            visit::visit_local(self, local);
        }
    }

    fn visit_pat_ident(&mut self, pat: &'ast syn::PatIdent) {
        if self.roots.contains(&pat.ident) {
            self.errors.at(
                pat.ident.span(),
                format!(
                    "the key parameter `{0}` is rebound inside the task\n\
                     = note: the key was computed from the caller's `{0}` before the body ran; a new `{0}` would not change it, only hide it\n\
                     = help: give the new value another name",
                    pat.ident
                ),
            );
        }
        visit::visit_pat_ident(self, pat);
    }

    fn visit_expr_assign(&mut self, assign: &'ast syn::ExprAssign) {
        self.assigned(&assign.left);
        visit::visit_expr_assign(self, assign);
    }

    fn visit_expr_binary(&mut self, binary: &'ast syn::ExprBinary) {
        use syn::BinOp::{
            AddAssign, BitAndAssign, BitOrAssign, BitXorAssign, DivAssign, MulAssign, RemAssign,
            ShlAssign, ShrAssign, SubAssign,
        };
        if matches!(
            binary.op,
            AddAssign(_)
                | SubAssign(_)
                | MulAssign(_)
                | DivAssign(_)
                | RemAssign(_)
                | BitXorAssign(_)
                | BitAndAssign(_)
                | BitOrAssign(_)
                | ShlAssign(_)
                | ShrAssign(_)
        ) {
            self.assigned(&binary.left);
        }
        visit::visit_expr_binary(self, binary);
    }

    fn visit_expr_reference(&mut self, reference: &'ast syn::ExprReference) {
        if reference.mutability.is_some()
            && let Some(ident) = self.key_root(&reference.expr)
        {
            self.errors.spanned(
                reference,
                format!("cannot borrow the key parameter `{ident}` mutably: the key is the caller's and fixed before the body runs"),
            );
        }
        visit::visit_expr_reference(self, reference);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        // `Task::call(key)`: the runtime API with a key made here.
        if call.method == "call" {
            self.generated_arguments(&call.args);
        }
        visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        let names_idempotask = matches!(&*call.func, Expr::Path(path)
            if path.path.segments.iter().any(|s| s.ident == "idempotask" || s.ident == "UnitOfWork"));
        if names_idempotask {
            self.generated_arguments(&call.args);
        }
        visit::visit_expr_call(self, call);
    }

    fn visit_item(&mut self, _: &'ast syn::Item) {
        // Items nested in the body are separate functions with their own parameters.
    }
}

/// Input: the key's parameters. Output: an error for each one declared `mut` or `&mut`.
pub(crate) fn check_declarations(params: &[Param], roots: &[Ident], errors: &mut Errors) {
    for param in params.iter().filter(|p| roots.contains(&p.ident)) {
        if let Some(span) = param.mut_ref {
            errors.at(
                span,
                format!("the key parameter `{}` must not be a mutable reference: the key is the caller's and fixed before the body runs; take `&` or a value", param.ident),
            );
        } else if let Some(span) = param.mutability {
            errors.at(
                span,
                format!("the key parameter `{}` must not be `mut`: the key is the caller's and fixed before the body runs", param.ident),
            );
        }
    }
}

/// Input: the `fingerprint` list. Output: the expression that fingerprints those parameters, or
/// an error for each name that is no parameter or is part of the key.
pub(crate) fn fingerprint(
    names: &[Ident],
    params: &[Param],
    roots: &[Ident],
    errors: &mut Errors,
) -> Option<TokenStream> {
    let mut fields = Vec::new();
    for name in names {
        if roots.contains(name) {
            errors.at(
                name.span(),
                format!("`{name}` is part of the key; the fingerprint lists the other parameters, the ones that must match when the key is reused"),
            );
            continue;
        }
        if let Some(param) = find_param(name, params, errors) {
            let ident = &param.ident;
            let ident = Ident::new(&ident.to_string(), name.span());
            fields.push(quote! { &#ident });
        }
    }
    (fields.len() == names.len()).then(|| quote! { &(#(#fields,)*) })
}
