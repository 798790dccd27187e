//! The ledger across three `abhyasa node` processes over loopback QUIC, driven only through
//! the CLI: `certs init/issue` (the ledger keys are the certificates' keys), TOML configs with a `[ledger]`
//! section, `ledger grant` at the root, `ledger delegate` to the child, `ledger spend` at the
//! child through the gateway (SIGKILLed and restarted while operations are in flight), `ledger
//! status --json`; then, with every node stopped, `ledger check` over the three state
//! directories.

use std::time::{Duration, Instant};

mod common;
use common::{abhyasa, free_udp, wait_for, NodeProc as Proc};

fn ok(args: &[&str]) -> String {
    let out = abhyasa(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn status(admin: &str) -> Option<serde_json::Value> {
    let out = abhyasa(&["ledger", "status", "--admin", admin, "--json"]);
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).ok())
        .flatten()
}

#[test]
fn grant_delegate_spend_and_check_across_three_node_processes() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let c = certs.to_str().unwrap();
    ok(&["certs", "init", "--dir", c]);
    for a in ["root", "child", "gw"] {
        ok(&["certs", "issue", a, "--dir", c]);
    }
    // The issuer signs root grants with its certificate's key, like every ledger signer.
    assert!(certs.join("issuer.pem").exists() && certs.join("issuer.key").exists());

    let ports: Vec<u16> = (0..3).map(|_| free_udp().port()).collect();
    let names = ["root", "child", "gw"];
    let admins: Vec<String> = names
        .iter()
        .map(|n| {
            dir.path()
                .join(format!("{n}-admin.sock"))
                .display()
                .to_string()
        })
        .collect();
    let state = |i: usize| dir.path().join(format!("state-{}", names[i]));
    let peers = [
        "[[peers]]\nid = \"child\"\naddr = \"127.0.0.1:{child}\"\n",
        "[[peers]]\nid = \"gw\"\naddr = \"127.0.0.1:{gw}\"\n",
        "",
    ];
    let configs: Vec<_> = (0..3)
        .map(|i| {
            let path = dir.path().join(format!("{}.toml", names[i]));
            let ledger = if names[i] == "gw" {
                "[ledger]\ngateway = true\nresend_ms = 200\n"
            } else {
                "[ledger]\nresend_ms = 200\n"
            };
            let peer = peers[i]
                .replace("{child}", &ports[1].to_string())
                .replace("{gw}", &ports[2].to_string());
            std::fs::write(
                &path,
                format!(
                    "agent = \"{}\"\nlisten = \"127.0.0.1:{}\"\ncerts = \"{c}\"\nstate = \"{}\"\nadmin = \"{}\"\n\n{ledger}\n{peer}",
                    names[i],
                    ports[i],
                    state(i).display(),
                    admins[i]
                ),
            )
            .unwrap();
            path
        })
        .collect();
    let mut procs: Vec<Option<Proc>> = configs.iter().map(|p| Some(Proc::start(p))).collect();
    for a in &admins {
        wait_for("a node's admin interface", Duration::from_secs(15), || {
            status(a).is_some()
        });
    }

    ok(&[
        "ledger",
        "grant",
        "--admin",
        &admins[0],
        "--certs",
        c,
        "--holder",
        "root",
        "--root",
        "1",
        "--budget",
        "cents=1000",
    ]);
    // A grant the issuer did not sign (signed with the root's own key) is refused.
    let forged = abhyasa(&[
        "ledger",
        "grant",
        "--admin",
        &admins[0],
        "--certs",
        c,
        "--issuer",
        "root",
        "--holder",
        "root",
        "--root",
        "2",
        "--budget",
        "cents=1000000",
    ]);
    assert!(!forged.status.success());
    ok(&[
        "ledger",
        "delegate",
        "--admin",
        &admins[0],
        "--credit",
        "1",
        "--to",
        "child",
        "--amount",
        "cents=400",
        "--transfer",
        "7",
    ]);
    let mut child_credit = String::new();
    wait_for("the child's credit", Duration::from_secs(20), || {
        status(&admins[1]).is_some_and(|s| {
            s["credits"].as_array().is_some_and(|cs| {
                cs.first().is_some_and(|c| {
                    child_credit = c["id"].as_str().unwrap().to_owned();
                    true
                })
            })
        })
    });
    for k in 0..6 {
        ok(&[
            "ledger",
            "spend",
            "--admin",
            &admins[1],
            "--credit",
            &child_credit,
            "--gateway",
            "gw",
            "--max",
            "cents=25",
            "--operation",
            &format!("search {k}"),
            "--key",
            &format!("{:x}", 100 + k),
        ]);
        if k == 2 {
            // The gateway dies with operations in flight and comes back.
            drop(procs[2].take());
            procs[2] = Some(Proc::start(&configs[2]));
        }
    }
    // The child re-dials the restarted gateway once its old connection idles out (5 s).
    let until = Instant::now() + Duration::from_secs(60);
    let all_settled = |s: &serde_json::Value| {
        let ops = s["operations"].as_array().unwrap();
        ops.len() == 6 && ops.iter().all(|o| o["state"] == "settled")
    };
    while !status(&admins[1]).is_some_and(|s| all_settled(&s)) {
        assert!(
            Instant::now() < until,
            "not every spend settled: child {} gateway {}",
            serde_json::to_string(&status(&admins[1])).unwrap(),
            serde_json::to_string(&status(&admins[2])).unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let s = status(&admins[1]).unwrap();
    // The reference executor charges the declared maximum: 6 × 25 cents committed.
    assert_eq!(s["roots"][0]["committed"], "cents=150");
    assert_eq!(s["roots"][0]["available"], "cents=250");
    let r = status(&admins[0]).unwrap();
    assert_eq!(r["transfers"][0]["state"], "accepted");
    assert_eq!(r["roots"][0]["available"], "cents=600");
    let human = ok(&["ledger", "status", "--admin", &admins[1]]);
    assert!(human.contains("committed cents=150"), "{human}");
    // Every operation ended: the child's generation rolls over into a fresh credit holding
    // the 250 cents left, and says which.
    let out = ok(&[
        "ledger",
        "reissue",
        "--admin",
        &admins[1],
        "--credit",
        &child_credit,
    ]);
    let next = out
        .trim()
        .strip_prefix("ok (durable): credit ")
        .unwrap_or_else(|| panic!("{out}"))
        .to_owned();
    let s = status(&admins[1]).unwrap();
    let credits = s["credits"].as_array().unwrap();
    let old = credits
        .iter()
        .find(|c| c["id"] == child_credit.as_str())
        .unwrap();
    assert_eq!(
        (&old["closed"], &old["available"]),
        (&true.into(), &"0".into())
    );
    let new = credits
        .iter()
        .find(|c| c["id"] == next.as_str())
        .unwrap_or_else(|| panic!("no credit {next} in {credits:?}"));
    assert_eq!(old["successor"], new["id"]);
    assert_eq!(
        (&new["generation"], &new["available"]),
        (&1.into(), &"cents=250".into())
    );

    // A reclaimable delegation to a child that is lost (no node answers for it), taken back
    // by the root without a word from it; the plain delegation above cannot be.
    ok(&[
        "ledger",
        "delegate",
        "--admin",
        &admins[0],
        "--credit",
        "1",
        "--to",
        "ghost",
        "--amount",
        "cents=100",
        "--transfer",
        "8",
        "--reclaimable",
    ]);
    let r = status(&admins[0]).unwrap();
    assert_eq!(r["roots"][0]["available"], "cents=500");
    ok(&[
        "ledger",
        "reclaim",
        "--admin",
        &admins[0],
        "--transfer",
        "8",
    ]);
    let refused = abhyasa(&[
        "ledger",
        "reclaim",
        "--admin",
        &admins[0],
        "--transfer",
        "7",
    ]);
    assert!(!refused.status.success(), "a plain transfer was reclaimed");
    let r = status(&admins[0]).unwrap();
    assert_eq!(r["roots"][0]["available"], "cents=600");
    let states: Vec<&str> = r["transfers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["accepted", "reclaimed"]);

    for p in procs.iter_mut() {
        p.take().unwrap().stop();
    }
    // The auditor holds public certificates only (the CA's and the agents'): no agent's
    // (or the issuer's) secret key.
    let public = dir.path().join("public-keys");
    std::fs::create_dir_all(&public).unwrap();
    for entry in std::fs::read_dir(&certs).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.ends_with(".pem") {
            std::fs::copy(&path, public.join(&name)).unwrap();
        }
    }
    let c = public.to_str().unwrap();
    let out = ok(&[
        "ledger",
        "check",
        "--certs",
        c,
        "--branch",
        &format!("root={}", state(0).display()),
        "--branch",
        &format!("child={}", state(1).display()),
        "--gateway",
        &format!("gw={}", state(2).display()),
    ]);
    assert!(
        out.trim_end()
            .ends_with("operations=6 effects=6 violations=0"),
        "{out}"
    );

    // The same files with the issuer's certificate swapped for another deployment's (an
    // issuer key the CA never certified): the auditor does not trust it and says so.
    let other = dir.path().join("other-deployment");
    let o = other.to_str().unwrap();
    ok(&["certs", "init", "--dir", o]);
    std::fs::copy(other.join("issuer.pem"), public.join("issuer.pem")).unwrap();
    let out = abhyasa(&[
        "ledger",
        "check",
        "--certs",
        c,
        "--branch",
        &format!("root={}", state(0).display()),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("not trusting") && err.contains("issuer.pem"),
        "{err}"
    );
    assert!(
        err.contains("root grant issuer issuer: no certificate of the deployment"),
        "{err}"
    );
}
