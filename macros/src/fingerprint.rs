//! The `fingerprint` option: which parameters, or which fields of them, must match when a key
//! is reused.
//!
//! Input: the option's list (`[amount_cents, order.amount]`) and the function's parameters.
//! Output: the expression whose JSON the runtime fingerprints, a tuple of references in the
//! listed order, so that `[order.amount, currency]` hashes the JSON list
//! `[<order.amount>, <currency>]` as the Python package's `["order.amount", "currency"]` does.

use proc_macro2::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::{Expr, Ident, Member};

use crate::args::Errors;
use crate::key::{Param, find_param};

/// One entry of the list: a parameter, then the named fields to follow into it.
struct FieldPath {
    root: Ident,
    fields: Vec<Ident>,
    /// The whole entry as written, where a type error (a field the type lacks) points.
    span: proc_macro2::Span,
}

impl FieldPath {
    /// The path as the Python package writes it: `order.amount`.
    fn dotted(&self) -> String {
        std::iter::once(&self.root)
            .chain(&self.fields)
            .map(Ident::to_string)
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// Reads the option's value: a list whose entries are parameter names or field paths. Every
/// entry that is neither is reported, not only the first; the others are returned, so that
/// their own mistakes are reported beside it.
fn parse(value: &Expr, errors: &mut Errors) -> Option<Vec<FieldPath>> {
    let Expr::Array(array) = value else {
        errors.at(
            value.span(),
            "expected a list of parameter names or field paths for `fingerprint`, like `fingerprint = [amount_cents, order.currency]`",
        );
        return None;
    };
    if array.elems.is_empty() {
        errors.at(
            array.span(),
            "an empty fingerprint checks nothing: list the parameters that must match when the key is reused, like `fingerprint = [amount_cents]`, or leave `fingerprint` out",
        );
        return None;
    }
    let mut paths = Vec::new();
    for elem in &array.elems {
        match path(elem) {
            Ok(found) => paths.push(found),
            Err(err) => errors.push(err),
        }
    }
    Some(paths)
}

/// `amount`, `order.amount` or `order.customer.country`; nothing else.
fn path(elem: &Expr) -> syn::Result<FieldPath> {
    let not_a_path = || {
        syn::Error::new_spanned(
            elem,
            "expected a parameter name or a field path like `order.amount`; the fingerprint is made of parameters and their named fields",
        )
    };
    let mut fields = Vec::new();
    let mut at = elem;
    loop {
        match at {
            Expr::Field(field) => {
                let Member::Named(name) = &field.member else {
                    return Err(syn::Error::new(
                        field.member.span(),
                        "expected a named field: a fingerprint path names fields, not tuple positions, so that a Python task of the same name can follow it",
                    ));
                };
                fields.push(name.clone());
                at = &field.base;
            }
            Expr::Path(path) if path.qself.is_none() => {
                let root = path.path.get_ident().cloned().ok_or_else(not_a_path)?;
                fields.reverse();
                return Ok(FieldPath {
                    root,
                    fields,
                    span: elem.span(),
                });
            }
            _ => return Err(not_a_path()),
        }
    }
}

/// Reads the option and checks its paths against the function: each starts at a parameter, a
/// whole parameter is not part of the key (a field of one may be: `order.amount` beside a key
/// of `{order.id}`), and no path is listed twice. A field the parameter's type does not have
/// is left to rustc, whose error points at the path.
pub(crate) fn check(
    value: &Expr,
    params: &[Param],
    roots: &[Ident],
    errors: &mut Errors,
) -> Option<TokenStream> {
    let listed = match value {
        Expr::Array(array) => array.elems.len(),
        _ => 0,
    };
    let paths = parse(value, errors)?;
    let mut fields = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for path in &paths {
        let dotted = path.dotted();
        if seen.contains(&dotted) {
            errors.at(
                path.span,
                format!("`{dotted}` is listed twice in the fingerprint"),
            );
            continue;
        }
        seen.push(dotted);
        if path.fields.is_empty() && roots.contains(&path.root) {
            errors.at(
                path.root.span(),
                format!("`{}` is part of the key; the fingerprint lists the other parameters, the ones that must match when the key is reused", path.root),
            );
            continue;
        }
        if let Some(param) = find_param(&path.root, params, errors) {
            // The parameter's own identifier (a raw one, `r#type`, stays raw), where the
            // entry names it.
            let mut root = param.ident.clone();
            root.set_span(path.root.span());
            let followed = &path.fields;
            fields.push(quote! { &#root #(.#followed)* });
        }
    }
    (fields.len() == listed).then(|| quote! { &(#(#fields,)*) })
}

#[cfg(test)]
mod tests {
    use super::check;
    use crate::args::Errors;
    use crate::key::Param;

    #[test]
    fn a_raw_parameter_name_is_fingerprinted_as_written() {
        let param: syn::FnArg = syn::parse_quote!(r#type: Kind);
        let syn::FnArg::Typed(typed) = param else {
            unreachable!()
        };
        let syn::Pat::Ident(pat) = *typed.pat else {
            unreachable!()
        };
        let params = [Param {
            ident: pat.ident,
            mutability: None,
            mut_ref: None,
        }];
        let mut errors = Errors::default();
        let value = syn::parse_quote!([r#type, r#type.r#match]);
        let fields = check(&value, &params, &[], &mut errors).map(|tokens| tokens.to_string());
        assert!(errors.into_result().is_ok());
        assert_eq!(
            fields.as_deref(),
            Some("& (& r#type , & r#type . r#match ,)")
        );
    }
}
