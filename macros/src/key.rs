//! The key: a template or a parameter, checked to come from the caller and stay as it came.
//!
//! Input: the `key` (and `fingerprint`) options and the function. Output: the expression that
//! builds the key string from borrowed arguments, or the mistakes in the key itself: a generated
//! key, a placeholder that names no parameter. What the body may not do with the key is
//! [`misuse`](crate::misuse)'s.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::quote_spanned;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, Pat, Type};

use crate::args::Errors;
use crate::generators::generated_key;
use crate::shape::Move;
use crate::suggest::did_you_mean;
use crate::taint::first_generator;

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
pub(crate) fn key(
    value: &Expr,
    params: &[Param],
    rt: &TokenStream,
    errors: &mut Errors,
) -> Option<Key> {
    if let Some(generated) = first_generator(value) {
        errors.push(generated_key(&generated));
        return None;
    }
    match value {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(template),
            ..
        }) => template_key(template, params, rt, errors),
        Expr::Path(path) if path.qself.is_none() && path.path.get_ident().is_some() => {
            let ident = path.path.get_ident()?;
            let param = find_param(ident, params, errors)?;
            let ident = param.ident.clone();
            let rt = respan(rt.clone(), ident.span());
            let build = quote_spanned! {ident.span()=>
                #rt::__private::key_from(&#ident)
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
fn template_key(
    template: &LitStr,
    params: &[Param],
    rt: &TokenStream,
    errors: &mut Errors,
) -> Option<Key> {
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
    let rt = respan(rt.clone(), span);
    Some(Key {
        build: quote_spanned! {span=> #rt::__private::format!(#format, #(#arguments),*) },
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
pub(crate) fn find_param<'p>(
    ident: &Ident,
    params: &'p [Param],
    errors: &mut Errors,
) -> Option<&'p Param> {
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

/// `tokens` with every span set to `span`, so that an error in them is reported there.
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
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
