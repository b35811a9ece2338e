//! The step checks on bodies written out, and the routing of the steps they find.

use super::*;

/// The messages' first lines for `body`, in the order they are reported.
fn errors(body: &Block) -> Vec<String> {
    let mut errors = Errors::default();
    check_body(&mut body.clone(), None, &mut errors);
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
        let ctx = idempotask::context().unwrap();
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
        let ctx = idempotask::context().unwrap();
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
        let ctx = idempotask::context().unwrap();
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
        let ctx = idempotask::context().unwrap();
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
    check_body(&mut body.clone(), None, &mut errors);
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
        let ctx = idempotask::context().unwrap();
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
        let ctx = idempotask::context().unwrap();
        ctx.step("charge", a()).await?;
        fn helper(ctx: &TaskContext) {
            ctx.step("charge", b());
        }
    });
    assert_eq!(errors(&body), Vec::<String>::new());
}

#[test]
fn a_step_is_a_call_on_the_context() {
    let body: Block = syn::parse_quote!({
        let ctx = idempotask::context().expect("inside a task");
        let sim = Simulation::new();
        sim.step(name, 1);
        for n in 0..3 {
            sim.step("tick", n);
        }
        {
            let ctx = Simulation::new();
            ctx.step(name, 2);
        }
        let copy = ctx.clone();
        copy.step(name, a()).await?;
        let mail = |ctx: &Simulation| ctx.step(name, 3);
        if let Some(inner) = idempotask::context() {
            inner.step(other, b()).await?;
        }
        ctx.step("charge", c()).await?;
    });
    let found = errors(&body);
    assert_eq!(
        found.len(),
        2,
        "`copy` and `inner` hold the context: {found:?}"
    );
    assert!(
        found
            .iter()
            .all(|message| message.starts_with("a step's name must be a string literal"))
    );
}

#[test]
fn a_step_is_routed_through_the_runtime_and_nothing_else_is() {
    let mut body: Block = syn::parse_quote!({
        let ctx = idempotask::context().expect("inside a task");
        let charge = ctx.step("charge", charge()).await?;
        let pending = ctx.step_or_hold("mail", mail());
        sim.step("tick", 1);
    });
    let mut errors = Errors::default();
    check_body(&mut body, None, &mut errors);
    assert!(errors.into_result().is_ok());
    let routed = body.to_token_stream().to_string();
    assert!(
        routed.contains(
            ":: idempotask :: __private :: step (& ctx , \"charge\" , charge ()) . await"
        ),
        "{routed}"
    );
    assert!(
        routed.contains(":: idempotask :: __private :: step_or_hold (& ctx , \"mail\" , mail ())"),
        "{routed}"
    );
    assert!(routed.contains("sim . step (\"tick\" , 1)"), "{routed}");
}
