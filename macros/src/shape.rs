//! The two shapes of function the attribute rewrites.
//!
//! Input: the function as rustc hands it over. Output: where its future's body is and what it
//! returns. An `async fn` is the first shape. The second is what `#[async_trait]` on an impl
//! makes of an `async fn` before this attribute expands: a plain `fn` returning
//! `Pin<Box<dyn Future<Output = R> + Send + 'async_trait>>` whose body is
//! `Box::pin(async move { .. })`. Inside that block async-trait moves each argument in
//! (`let __self = self; let order_id = order_id;`) before the user's body; those moves are
//! recognised here so that the key checks do not take them for the user's rebinding.

use proc_macro2::Span;
use syn::visit::{self, Visit};
use syn::{
    Block, Expr, ExprAsync, FnArg, GenericArgument, Ident, ItemFn, Local, Pat, PathArguments,
    ReturnType, Stmt, Type, TypeParamBound,
};

/// What the attribute rewrites.
pub(crate) enum Shape<'f> {
    /// `async fn`: the function's block is the body.
    Async,
    /// A plain `fn` whose block is `Box::pin(async move { .. })`.
    Boxed(Boxed<'f>),
}

/// The parts of `fn f(..) -> Pin<Box<dyn Future<Output = R> + ..>> { Box::pin(async move { .. }) }`.
pub(crate) struct Boxed<'f> {
    /// The `Box::pin` path as written, re-emitted around the rewritten future.
    pub(crate) pin: &'f Expr,
    /// The `async move` block, the body of the task.
    pub(crate) future: &'f ExprAsync,
    /// `R` in `Future<Output = R>`.
    pub(crate) output: &'f Type,
    /// async-trait's moves of the arguments into the block, in parameter order; empty when the
    /// block does not start with them (a hand-written boxed future, or a function without
    /// by-value parameters).
    pub(crate) moves: Vec<Move<'f>>,
}

/// One `let [mut] order_id = order_id;` that async-trait writes for a by-value parameter.
pub(crate) struct Move<'f> {
    /// The statement, to be left out of the key checks.
    pub(crate) local: &'f Local,
    /// The parameter it moves: `self` for the receiver, which the body names `__self`.
    pub(crate) param: Ident,
    /// `mut` on the binding. async-trait moves a parameter's `mut` from the signature to this
    /// binding, so a `mut` key parameter is seen here; on the receiver it can also come from
    /// `&mut self`, which the signature still shows.
    pub(crate) mutability: Option<Span>,
}

/// Input: the function. Output: its shape, or `None` for a plain `fn` of any other form.
pub(crate) fn of(function: &ItemFn) -> Option<Shape<'_>> {
    if function.sig.asyncness.is_some() {
        return Some(Shape::Async);
    }
    let ReturnType::Type(_, ty) = &function.sig.output else {
        return None;
    };
    let output = boxed_future_output(ty)?;
    let [Stmt::Expr(Expr::Call(call), None)] = function.block.stmts.as_slice() else {
        return None;
    };
    let Expr::Path(path) = &*call.func else {
        return None;
    };
    let mut segments = path.path.segments.iter().rev();
    let is_box_pin = segments.next().is_some_and(|s| s.ident == "pin")
        && segments.next().is_some_and(|s| s.ident == "Box");
    if !is_box_pin || call.args.len() != 1 {
        return None;
    }
    let Expr::Async(future) = &call.args[0] else {
        return None;
    };
    future.capture?;
    Some(Shape::Boxed(Boxed {
        pin: &call.func,
        future,
        output,
        moves: moves(&function.sig.inputs, &future.block),
    }))
}

/// `R` in `Pin<Box<dyn Future<Output = R> + ..>>`, the return type async-trait writes.
pub(crate) fn boxed_future_output(ty: &Type) -> Option<&Type> {
    let pin = single_type_argument(ty, "Pin")?;
    let Type::TraitObject(object) = ungroup(single_type_argument(pin, "Box")?) else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let future = bound.path.segments.last().filter(|s| s.ident == "Future")?;
        let PathArguments::AngleBracketed(arguments) = &future.arguments else {
            return None;
        };
        arguments.args.iter().find_map(|argument| match argument {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

/// `T` in `…::Name<T>`.
fn single_type_argument<'t>(ty: &'t Type, name: &str) -> Option<&'t Type> {
    let Type::Path(path) = ungroup(ty) else {
        return None;
    };
    let segment = path.path.segments.last().filter(|s| s.ident == name)?;
    let PathArguments::AngleBracketed(arguments) = &segment.arguments else {
        return None;
    };
    match arguments.args.iter().collect::<Vec<_>>().as_slice() {
        [GenericArgument::Type(inner)] => Some(inner),
        _ => None,
    }
}

/// Types that passed through a `macro_rules!` fragment arrive in invisible groups.
fn ungroup(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => ungroup(&group.elem),
        other => other,
    }
}

/// Which binding async-trait writes for one parameter.
enum Expected<'s> {
    /// `let [mut] __self = self;`
    Receiver,
    /// `let [mut] order_id = order_id;`, or for a destructured parameter, which async-trait
    /// renames `__argN`, `let (a, b) = { let __argN = __argN; __argN };`.
    Named(&'s Ident),
}

/// Input: the parameters and the `async move` block. Output: async-trait's moves of the
/// by-value parameters, found at the start of the first block (in source order) that begins
/// with all of them, after async-trait's `if let Some(__ret) = None::<R> { return __ret; }`;
/// empty when no block does. The search goes into nested blocks because an attribute expanded
/// in between (`#[instrument]`) wraps async-trait's block in its own.
fn moves<'f>(
    inputs: &'f syn::punctuated::Punctuated<FnArg, syn::Token![,]>,
    block: &'f Block,
) -> Vec<Move<'f>> {
    let mut expected = Vec::new();
    for input in inputs {
        match input {
            FnArg::Receiver(_) => expected.push(Expected::Receiver),
            // async-trait moves no reference: it is `Copy` and the lifetimes already say
            // how long it lives.
            FnArg::Typed(typed) if matches!(ungroup(&typed.ty), Type::Reference(_)) => {}
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(pat) => expected.push(Expected::Named(&pat.ident)),
                // Not a signature async-trait writes: it renames every other pattern.
                _ => return Vec::new(),
            },
        }
    }
    if expected.is_empty() {
        return Vec::new();
    }
    let mut finder = Finder {
        expected: &expected,
        found: None,
    };
    finder.visit_block(block);
    finder.found.unwrap_or_default()
}

struct Finder<'e, 'f> {
    expected: &'e [Expected<'f>],
    found: Option<Vec<Move<'f>>>,
}

impl<'f> Visit<'f> for Finder<'_, 'f> {
    fn visit_block(&mut self, block: &'f Block) {
        if self.found.is_some() {
            return;
        }
        let stmts = match block.stmts.split_first() {
            Some((first, rest)) if is_return_type_edge(first) => rest,
            _ => block.stmts.as_slice(),
        };
        if stmts.len() >= self.expected.len() {
            let found: Option<Vec<Move<'f>>> = self
                .expected
                .iter()
                .zip(stmts)
                .map(|(expected, stmt)| matches_move(expected, stmt))
                .collect();
            if found.is_some() {
                self.found = found;
                return;
            }
        }
        visit::visit_block(self, block);
    }

    fn visit_item(&mut self, _: &'f syn::Item) {
        // Items nested in the body are separate functions with their own parameters.
    }
}

/// async-trait's `if let Some(__ret) = None::<R> { return __ret; }`, which gives the block
/// the declared return type.
fn is_return_type_edge(stmt: &Stmt) -> bool {
    let Stmt::Expr(Expr::If(edge), _) = stmt else {
        return false;
    };
    let Expr::Let(cond) = &*edge.cond else {
        return false;
    };
    let Pat::TupleStruct(some) = &*cond.pat else {
        return false;
    };
    matches!(some.elems.iter().collect::<Vec<_>>().as_slice(),
        [Pat::Ident(ret)] if ret.ident == "__ret")
}

/// The move of `expected`, if `stmt` is it.
fn matches_move<'f>(expected: &Expected<'_>, stmt: &'f Stmt) -> Option<Move<'f>> {
    let Stmt::Local(local) = stmt else {
        return None;
    };
    let init = local.init.as_ref().filter(|init| init.diverge.is_none())?;
    match expected {
        Expected::Receiver => {
            let Pat::Ident(binding) = &local.pat else {
                return None;
            };
            (binding.ident == "__self"
                && binding.subpat.is_none()
                && is_path_to(&init.expr, "self"))
            .then(|| Move {
                local,
                param: Ident::new("self", binding.ident.span()),
                mutability: binding.mutability.map(|m| m.span),
            })
        }
        Expected::Named(param) => match &local.pat {
            Pat::Ident(binding)
                if binding.ident == **param
                    && binding.subpat.is_none()
                    && is_path_to(&init.expr, &param.to_string()) =>
            {
                Some(Move {
                    local,
                    param: (*param).clone(),
                    mutability: binding.mutability.map(|m| m.span),
                })
            }
            _ if is_moved_block(&init.expr, param) => Some(Move {
                local,
                param: (*param).clone(),
                mutability: None,
            }),
            _ => None,
        },
    }
}

/// `{ let __argN = __argN; __argN }`, async-trait's move of a destructured parameter.
fn is_moved_block(expr: &Expr, param: &Ident) -> bool {
    let Expr::Block(block) = expr else {
        return false;
    };
    match block.block.stmts.as_slice() {
        [Stmt::Local(local), Stmt::Expr(last, None)] => {
            matches!(&local.pat, Pat::Ident(binding) if binding.ident == *param)
                && local
                    .init
                    .as_ref()
                    .is_some_and(|init| is_path_to(&init.expr, &param.to_string()))
                && is_path_to(last, &param.to_string())
        }
        _ => false,
    }
}

fn is_path_to(expr: &Expr, name: &str) -> bool {
    matches!(expr, Expr::Path(path) if path.qself.is_none() && path.path.is_ident(name))
}

#[cfg(test)]
mod tests {
    use super::{Shape, of};
    use syn::ItemFn;

    /// async-trait 0.1's expansion of
    /// `async fn run(&self, order_id: u64, mut note: String, (a, b): (u8, u8), r: &str) -> R`.
    fn async_trait_output() -> ItemFn {
        syn::parse_quote! {
            fn run<'life0, 'life1, 'async_trait>(
                &'life0 self,
                order_id: u64,
                note: String,
                __arg3: (u8, u8),
                r: &'life1 str,
            ) -> ::core::pin::Pin<Box<
                dyn ::core::future::Future<Output = Result<String, Error>> + ::core::marker::Send + 'async_trait
            >>
            where 'life0: 'async_trait, 'life1: 'async_trait, Self: 'async_trait
            {
                Box::pin(async move {
                    if let ::core::option::Option::Some(__ret) = ::core::option::Option::None::<Result<String, Error>> {
                        #[allow(unreachable_code)]
                        return __ret;
                    }
                    let __self = self;
                    let order_id = order_id;
                    let mut note = note;
                    let (a, b) = { let __arg3 = __arg3; __arg3 };
                    let __ret: Result<String, Error> = {
                        let order_id = order_id;
                        Ok(format!("{order_id}{note}{a}{b}{r}"))
                    };
                    #[allow(unreachable_code)]
                    __ret
                })
            }
        }
    }

    #[test]
    fn recognises_async_trait_output_and_its_moves() {
        let function = async_trait_output();
        let Some(Shape::Boxed(boxed)) = of(&function) else {
            panic!("not recognised");
        };
        let moved: Vec<String> = boxed.moves.iter().map(|m| m.param.to_string()).collect();
        assert_eq!(moved, ["self", "order_id", "note", "__arg3"]);
        let mutable: Vec<bool> = boxed.moves.iter().map(|m| m.mutability.is_some()).collect();
        assert_eq!(mutable, [false, false, true, false]);
        let output = boxed.output;
        assert_eq!(
            quote::quote!(#output).to_string(),
            "Result < String , Error >"
        );
    }

    /// The user's own `let order_id = order_id;`, the first statement of the body, looks like
    /// one of async-trait's moves and must stay a rebinding to report.
    #[test]
    fn moves_stop_before_the_users_body() {
        let function = async_trait_output();
        let Some(Shape::Boxed(boxed)) = of(&function) else {
            panic!("not recognised");
        };
        let Some(syn::Stmt::Local(ret)) = boxed.future.block.stmts.get(5) else {
            panic!("no `let __ret` statement");
        };
        let Some(syn::Expr::Block(body)) = ret.init.as_ref().map(|init| &*init.expr) else {
            panic!("`__ret` is not a block");
        };
        let Some(syn::Stmt::Local(users)) = body.block.stmts.first() else {
            panic!("the body does not start with a `let`");
        };
        assert_eq!(boxed.moves.len(), 4);
        assert!(boxed.moves.iter().all(|m| !std::ptr::eq(m.local, users)));
    }

    /// `#[instrument]` expanded before this attribute nests async-trait's block in its own.
    #[test]
    fn finds_the_moves_inside_a_wrapping_block() {
        let function: ItemFn = syn::parse_quote! {
            fn run<'life0, 'async_trait>(&'life0 self, order_id: u64)
                -> ::core::pin::Pin<Box<dyn ::core::future::Future<Output = Result<u64, Error>> + 'async_trait>>
            {
                ::std::boxed::Box::pin(async move {
                    let __tracing_attr_span = ::tracing::Span::none();
                    let __tracing_instrument_future = async move {
                        let __self = self;
                        let order_id = order_id;
                        let __ret: Result<u64, Error> = { Ok(order_id) };
                        __ret
                    };
                    __tracing_instrument_future.await
                })
            }
        };
        let Some(Shape::Boxed(boxed)) = of(&function) else {
            panic!("not recognised");
        };
        assert_eq!(boxed.moves.len(), 2);
    }

    #[test]
    fn a_plain_fn_is_no_shape() {
        let function: ItemFn = syn::parse_quote! {
            fn charge(order_id: u64) -> Result<u64, Error> { Ok(order_id) }
        };
        assert!(of(&function).is_none());
        let unpinned: ItemFn = syn::parse_quote! {
            fn charge(order_id: u64) -> ::core::pin::Pin<Box<dyn Future<Output = Result<u64, Error>>>> {
                Box::pin(charge_later(order_id))
            }
        };
        assert!(of(&unpinned).is_none());
    }
}
