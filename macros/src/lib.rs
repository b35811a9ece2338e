//! The `#[idempotent_task]` attribute. Use it through the `idempotask` crate, which re-exports
//! it and documents it in full.

mod args;
mod context;
mod expand;
mod fingerprint;
mod generators;
mod key;
mod misuse;
mod shape;
mod steps;
mod suggest;
mod taint;
mod values;

use proc_macro::TokenStream;
use quote::{ToTokens, quote};
use syn::spanned::Spanned;
use syn::{ItemFn, ReturnType};

use crate::args::{Args, Errors};
use crate::shape::Shape;

/// Runs an `async fn` at most once per caller-supplied key; see the `idempotask` crate.
#[proc_macro_attribute]
pub fn idempotent_task(attr: TokenStream, item: TokenStream) -> TokenStream {
    let expanded = rewrite(attr.into(), &item.into());
    if std::env::var_os("IDEMPOTASK_MACROS_DEBUG").is_some_and(|v| v != "0") {
        eprintln!("{expanded}");
    }
    expanded.into()
}

/// Input: an item that is not a function syn can read. Output: whether it is one all the same,
/// a signature followed by a `{ … }` body, so that only the body failed to parse.
fn is_function_with_unparsable_body(item: &proc_macro2::TokenStream) -> bool {
    use syn::parse::{ParseStream, Parser};
    let function_shape = |input: ParseStream| -> syn::Result<()> {
        input.call(syn::Attribute::parse_outer)?;
        input.parse::<syn::Visibility>()?;
        input.parse::<syn::Signature>()?;
        let body: proc_macro2::Group = input.parse()?;
        if body.delimiter() == proc_macro2::Delimiter::Brace && input.is_empty() {
            Ok(())
        } else {
            Err(input.error("not a function body"))
        }
    };
    function_shape.parse2(item.clone()).is_ok()
}

/// Input: the attribute and the item. Output: the rewritten function, or the original item next
/// to every error found, so that one mistake does not bury the crate under follow-up errors.
fn rewrite(
    attr: proc_macro2::TokenStream,
    item: &proc_macro2::TokenStream,
) -> proc_macro2::TokenStream {
    let Ok(function) = syn::parse2::<ItemFn>(item.clone()) else {
        if is_function_with_unparsable_body(item) {
            // The body's own syntax error is the one to read: handed back as it is, the item
            // gets rustc's error, once, and no second one from here.
            return item.clone();
        }
        let message = if syn::parse2::<syn::TraitItemFn>(item.clone()).is_ok() {
            "`#[idempotent_task]` needs a function body; put it on the trait's implementation, not its declaration"
        } else {
            "`#[idempotent_task]` applies to an `async fn`"
        };
        let error = syn::Error::new(proc_macro2::Span::call_site(), message).to_compile_error();
        return quote! { #error #item };
    };
    let mut errors = Errors::default();
    let args = Args::parse(attr, &mut errors);
    let shape = shape::of(&function);
    check_signature(&function, shape.as_ref(), &mut errors);
    let (body, moves) = match &shape {
        Some(Shape::Boxed(boxed)) => (&boxed.future.block, boxed.moves.as_slice()),
        Some(Shape::Async) | None => (&*function.block, [].as_slice()),
    };
    // async-trait renames `self` in the body when it moves the receiver in.
    let self_renamed = moves.iter().any(|moved| moved.param == "self");
    let not_users: Vec<&syn::Local> = moves.iter().map(|moved| moved.local).collect();
    let params = key::params(&function, moves);
    let checked = args.as_ref().and_then(|args| {
        let Some(value) = &args.key else {
            errors.at(
                proc_macro2::Span::call_site(),
                "missing `key`: every idempotent task needs the caller's idempotency key, like `#[idempotent_task(key = \"order-charge-{order_id}\")]`",
            );
            return None;
        };
        let key = key::key(value, &params, &args.runtime(), &mut errors)?;
        misuse::check_declarations(&params, &key.roots, &mut errors);
        misuse::check_body(body, &key.roots, &not_users, self_renamed, &mut errors);
        let fingerprint = match &args.fingerprint {
            Some(value) => Some(fingerprint::check(value, &params, &key.roots, &mut errors)?),
            None => None,
        };
        Some(expand::Checked {
            args,
            key,
            fingerprint,
        })
    });
    // The steps are routed in the whole block, which holds the body in either shape.
    let mut routed = function.clone();
    let krate = args.as_ref().and_then(|args| args.krate.as_ref());
    steps::check_body(&mut routed.block, krate, &mut errors);
    match (errors.into_result(), checked) {
        (Ok(()), Some(checked)) => match shape::of(&routed) {
            Some(shape) => expand::function(&routed, &shape, &checked),
            None => unreachable!("a function of no known shape was reported"),
        },
        (Err(err), _) => {
            let errors = err.to_compile_error();
            quote! { #errors #function }
        }
        (Ok(()), None) => function.into_token_stream(),
    }
}

/// Input: the function and its shape, `None` for a plain `fn` of no shape this attribute
/// rewrites. Output: an error for each way its signature cannot be a task.
fn check_signature(function: &ItemFn, shape: Option<&Shape<'_>>, errors: &mut Errors) {
    let sig = &function.sig;
    if let Some(constness) = sig.constness {
        errors.at(
            constness.span,
            "an idempotent task cannot be a `const fn`: it talks to a store",
        );
    }
    if let Some(abi) = &sig.abi {
        errors.at(
            abi.span(),
            "an idempotent task cannot be an `extern` function; remove the ABI",
        );
    }
    let declared = match &sig.output {
        ReturnType::Default => None,
        ReturnType::Type(_, ty) => Some(&**ty),
    };
    let boxed_output = declared.and_then(shape::boxed_future_output);
    // A `const fn` cannot be async either; one error says it.
    if shape.is_none() && sig.constness.is_none() {
        // The source may say `async fn` although this attribute sees a plain `fn`: an attribute
        // expanded before it can rewrite the function. So the message says what was seen and
        // both ways out, and never asks for an `async fn` that is already written.
        let seen = if boxed_output.is_some() {
            "a plain `fn` whose boxed future is not `Box::pin(async move { .. })`"
        } else {
            "a plain `fn`, not an `async fn`"
        };
        errors.at(
            sig.fn_token.span,
            format!(
                "`#[idempotent_task]` found {seen}\n\
                 = note: it rewrites an `async fn`, or the `Box::pin(async move {{ .. }})` that `#[async_trait]` makes of one; an attribute macro expanded before it can turn an `async fn` into another shape\n\
                 = help: if `{name}` is written `fn`, make it `async fn {name}`; if it is written `async fn`, put `#[idempotent_task]` above the attribute that rewrites it, so that `#[idempotent_task]` expands first",
                name = sig.ident
            ),
        );
    }
    let output = match shape {
        Some(Shape::Boxed(boxed)) => Some(boxed.output),
        Some(Shape::Async) => declared,
        None => boxed_output.or(declared),
    };
    // Whether a declared type is a `Result` is the type system's to say: the expansion's
    // `TaskOutput` bound names the type when it is not, and an alias of `Result` passes.
    if output.is_none() {
        errors.at(
            sig.paren_token.span.close(),
            "an idempotent task must return a `Result`, like `-> Result<ChargeId, PaymentError>`: its `Ok` value is stored and errors are never cached",
        );
    }
}
