//! Misuse of the key: one minted inside the task, or a key parameter changed after the key was
//! computed from it.
//!
//! A macro sees syntax only, so the checks decide by what is evidently a fresh value (a UUID,
//! the clock, a random number) and evidently idempotask's API (a path through `idempotask::`,
//! `Task`, `UnitOfWork`, a `Task` built or a `Call` run in the same expression). A body may
//! stamp its own outbound requests with the time or a request id: only the key is the caller's.

use syn::visit::{self, Visit};
use syn::{Block, Expr, Ident, Local, Pat};

use crate::args::Errors;
use crate::generators::generated_key;
use crate::key::Param;
use crate::taint::{Locals, Origin};

/// The error for a generated value that reaches a nested call's key, at its generator; the
/// local it went through, if any, in the note.
fn generated_nested_key(origin: &Origin) -> syn::Error {
    let Some(binding) = &origin.binding else {
        return generated_key(&origin.generator);
    };
    syn::Error::new_spanned(
        &origin.generator,
        format!(
            "the idempotency key must be supplied by the caller, not generated inside the task\n\
             = note: this value is bound to `{binding}`, which a nested call uses as its key\n\
             = note: a value made on each delivery differs between deliveries, so a duplicate is never recognised\n\
             = help: derive the nested key from the task's own key or arguments: `format!(\"receipt-{{order_id}}\")`"
        ),
    )
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
        checked: Vec::new(),
        locals: Locals::default(),
    };
    checker.visit_block(body);
}

struct BodyChecker<'a> {
    roots: &'a [Ident],
    not_users: &'a [&'a Local],
    self_renamed: bool,
    errors: &'a mut Errors,
    /// `.call(…)`s whose arguments were checked as the receiver of a `.run(…)`.
    checked: Vec<*const syn::ExprMethodCall>,
    /// The locals in scope, and which of them carry a generated value.
    locals: Locals,
}

/// The methods of idempotask's `Call`: a `.call(…)` right before one of them made a `Call`.
const CALL_METHODS: &[&str] = &["run", "run_reported", "fingerprint", "store"];

/// Whether `expr` is evidently an idempotask `Task`: built in the expression (`Task::new(…)`,
/// `idempotask::Task::named(…)`, then its builder methods) or named through `idempotask::`.
fn is_task(expr: &Expr) -> bool {
    match expr {
        Expr::MethodCall(call) => is_task(&call.receiver),
        Expr::Call(call) => matches!(&*call.func, Expr::Path(path)
            if path.path.segments.iter().any(|s| s.ident == "Task" || s.ident == "idempotask")),
        Expr::Path(path) => path.path.segments.iter().any(|s| s.ident == "idempotask"),
        Expr::Reference(reference) => is_task(&reference.expr),
        Expr::Paren(paren) => is_task(&paren.expr),
        _ => false,
    }
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
            let origin = self
                .locals
                .first_generator(arg)
                .map(|generator| Origin {
                    generator,
                    binding: None,
                })
                .or_else(|| self.locals.origin_of(arg));
            if let Some(origin) = origin {
                self.errors.push(generated_nested_key(&origin));
            }
        }
    }

    /// Visits `then` in a scope of its own, in which `pat` is bound to `value`.
    fn bound_in(&mut self, pat: &Pat, value: &Expr, then: impl FnOnce(&mut Self)) {
        self.locals.enter();
        self.locals.bind_to(pat, Some(value));
        then(self);
        self.locals.leave();
    }
}

impl<'ast> Visit<'ast> for BodyChecker<'_> {
    fn visit_local(&mut self, local: &'ast Local) {
        if self.not_users.iter().any(|not| std::ptr::eq(*not, local)) {
            return;
        }
        visit::visit_local(self, local);
        // Bound after its initialiser is walked: `let key = key.clone();` reads the outer one.
        self.locals
            .bind_to(&local.pat, local.init.as_ref().map(|init| &*init.expr));
    }

    fn visit_block(&mut self, block: &'ast Block) {
        self.locals.enter();
        visit::visit_block(self, block);
        self.locals.leave();
    }

    fn visit_expr_closure(&mut self, closure: &'ast syn::ExprClosure) {
        // Its parameters hide the outer locals of their names in its body.
        self.locals.enter_closure(closure);
        visit::visit_expr_closure(self, closure);
        self.locals.leave();
    }

    fn visit_expr_if(&mut self, expr: &'ast syn::ExprIf) {
        // `if let`: its bindings live in the `then` branch only.
        self.locals.enter();
        self.visit_expr(&expr.cond);
        self.visit_block(&expr.then_branch);
        self.locals.leave();
        if let Some((_, otherwise)) = &expr.else_branch {
            self.visit_expr(otherwise);
        }
    }

    fn visit_expr_let(&mut self, expr: &'ast syn::ExprLet) {
        visit::visit_expr_let(self, expr);
        self.locals.bind_to(&expr.pat, Some(&expr.expr));
    }

    fn visit_expr_while(&mut self, expr: &'ast syn::ExprWhile) {
        self.locals.enter();
        self.visit_expr(&expr.cond);
        self.visit_block(&expr.body);
        self.locals.leave();
    }

    fn visit_expr_for_loop(&mut self, expr: &'ast syn::ExprForLoop) {
        self.visit_expr(&expr.expr);
        self.visit_pat(&expr.pat);
        self.bound_in(&expr.pat, &expr.expr, |this| this.visit_block(&expr.body));
    }

    fn visit_expr_match(&mut self, expr: &'ast syn::ExprMatch) {
        self.visit_expr(&expr.expr);
        for arm in &expr.arms {
            self.bound_in(&arm.pat, &expr.expr, |this| {
                visit::visit_arm(this, arm);
            });
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
        if call.method == "call"
            && is_task(&call.receiver)
            && !self.checked.contains(&std::ptr::from_ref(call))
        {
            // `Task::new("…").call(key)`: the runtime API, with a key made here.
            self.generated_arguments(&call.args);
        } else if CALL_METHODS.contains(&call.method.to_string().as_str())
            && let Expr::MethodCall(inner) = &*call.receiver
            && inner.method == "call"
        {
            // `TASK.call(key).run(async { … })`: a `Call` run on the spot is idempotask's.
            self.generated_arguments(&inner.args);
            self.checked.push(std::ptr::from_ref(inner));
        }
        visit::visit_expr_method_call(self, call);
    }

    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        // `idempotask::…(key)`, `UnitOfWork::new(task, key)`, `Task::call(&task, key)`.
        let names_idempotask = matches!(&*call.func, Expr::Path(path)
            if path.path.segments.iter().any(|s| ["idempotask", "UnitOfWork", "Task"].iter().any(|ours| s.ident == ours)));
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
