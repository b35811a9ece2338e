//! A private certificate authority of the test's own and a server certificate for 127.0.0.1
//! signed by it, made with the `openssl` command line tool.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `ca.crt`, `server.crt` and `server.key` (PEM) in a temporary directory, removed when dropped.
/// The server certificate names `IP:127.0.0.1`, so that a client checking host names accepts
/// it on the loopback address, and only when it trusts `ca.crt`.
pub struct PrivateCa {
    dir: PathBuf,
}

impl PrivateCa {
    /// A fresh CA (valid two days) and a server certificate it signed.
    pub fn generate() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "idempotask-ca-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("create the certificates' directory");
        let ca = Self { dir };
        let rsa = ["-newkey", "rsa:2048", "-nodes", "-days", "2"];
        // The CA: self-signed.
        ca.openssl(&[
            &["req", "-x509"],
            &rsa[..],
            &["-keyout", "ca.key", "-out", "ca.crt"],
            &["-subj", "/CN=idempotask test CA"],
        ]);
        // The server: signed by the CA in the same step (`req -x509 -CA`, OpenSSL 3).
        ca.openssl(&[
            &["req", "-x509"],
            &rsa[..],
            &["-keyout", "server.key", "-out", "server.crt"],
            &[
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-subj",
                "/CN=127.0.0.1",
            ],
            // An end entity (`v3_req`: `CA:FALSE`), not a second CA (`req -x509`'s default).
            &[
                "-extensions",
                "v3_req",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ],
        ]);
        ca
    }

    /// The CA's certificate (PEM): what a client is given to trust the server.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.path("ca.crt")).expect("read ca.crt")
    }

    /// `ca.crt`, `server.crt` or `server.key` in the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The `redis-server` arguments of a TLS port that serves the server certificate, with
    /// client certificates not asked for.
    pub fn redis_args(&self, tls_port: u16) -> Vec<String> {
        let path = |name: &str| path_string(&self.path(name));
        vec![
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            path("server.crt"),
            "--tls-key-file".to_owned(),
            path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            path("ca.crt"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ]
    }

    fn openssl(&self, args: &[&[&str]]) {
        let output = Command::new("openssl")
            .args(args.concat())
            .current_dir(&self.dir)
            .output()
            .expect("openssl is needed to make the test certificates (apt-get install -y openssl)");
        assert!(
            output.status.success(),
            "openssl {:?}: {}",
            args.concat(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for PrivateCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn path_string(path: &Path) -> String {
    path.to_str().expect("a UTF-8 temporary path").to_owned()
}
