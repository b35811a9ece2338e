//! Tenants, passwords, ACL users and TLS.

use super::*;

// 12. Security: tenants, passwords, ACL users.
on_both_servers!(s12_tenants_are_isolated_and_credentials_are_checked);
async fn s12_tenants_are_isolated_and_credentials_are_checked(server_flavor: Flavor) {
    let server = RedisServer::start_flavor(server_flavor, &["--requirepass", "s3cret"]);
    let url = |password: &str| format!("redis://:{password}@127.0.0.1:{}", server.port());
    let tenant = |name: &'static str| {
        let url = url("s3cret");
        async move {
            RedisStore::builder(url)
                .namespace(name)
                .connect()
                .await
                .unwrap()
        }
    };
    let (acme, globex) = (tenant("acme").await, tenant("globex").await);
    let task = Task::new("s12");
    let runs = AtomicU64::new(0);
    for store in [acme.clone(), globex.clone(), acme, globex] {
        task.call("invoice-1")
            .store(store)
            .run(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one execution per tenant");

    let started = Instant::now();
    let err = RedisStore::builder(url("wrong"))
        .connection_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    let wrong_took = started.elapsed();
    assert_eq!(err.kind(), StoreErrorKind::Configuration, "{err}");
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{}", server.port()))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        StoreErrorKind::Configuration,
        "no password: {err}"
    );
    record_on(
        server_flavor,
        "12. tenants and credentials",
        &format!(
            "two namespaces, one key: 2 executions (one each); requirepass: right password works, wrong or missing password fails with a `Configuration` error in {} ms; ACL user limited to `~idempotask:*` works (stores/redis/tests/redis_store.rs); TLS: see 12b",
            wrong_took.as_millis()
        ),
    );
}

/// A private CA and a certificate for 127.0.0.1 signed by it, made with `openssl`.
fn make_certificates(dir: &std::path::Path) {
    let openssl = |args: &[&str]| {
        let output = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl is needed to make the test certificates");
        assert!(
            output.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"],
            &key[..],
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=idempotask test CA",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"],
            &key[..],
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
}

// 12b. TLS: `rediss://` against a redis-server with a TLS port and a private CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12b_rediss_works_against_a_tls_redis_and_checks_its_certificate() {
    let dir = std::env::temp_dir().join(format!("idempotask-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificates(&dir);
    let tls_port = support::free_port();
    let path = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &path("server.crt"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let store = RedisStore::builder(&url)
        .tls_root_certificate(ca)
        .connect()
        .await
        .unwrap();
    let runs = AtomicU64::new(0);
    for _ in 0..3 {
        let value: u8 = Task::new("s12b")
            .call("k")
            .store(store.clone())
            .run(async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(4)
            })
            .await
            .unwrap();
        assert_eq!(value, 4);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The same server is not trusted without its CA.
    let untrusted = RedisStore::builder(&url)
        .connection_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(
        untrusted.is_err(),
        "a certificate from an unknown CA was accepted"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    record(
        "12b. TLS",
        "`rediss://` to a redis-server TLS port with a private CA (`tls_root_certificate`): 3 deliveries, 1 execution; without the CA the connection is refused",
    );
}
