//! The cluster policy document with real processes: users, access rules, tokens and
//! residency rules edited with `meridian ctl` in one region and in force in the others,
//! edits on both sides of a cut link merged when it returns, and the history of who changed
//! what, where and when. Clients are rumqttc (MQTT 3.1.1 and 5.0).

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use common::mesh::{Node, cluster_key, metric, next_publish, node_info, wait_for};
use common::{Daemon, cheap_hash, free_port, http, meridian, v3, v5};
use meridian_tools::link_proxy::LinkProxy as Proxy;
use rumqttc::QoS;

/// `meridian ctl --admin 127.0.0.1:PORT ARGS`, with `stdin` written to it: its exit status
/// and what it printed.
fn ctl(admin: u16, args: &[&str], stdin: &str) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .arg("ctl")
        .arg("--admin")
        .arg(format!("127.0.0.1:{admin}"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run meridian ctl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("meridian ctl ends");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ctl` that must succeed; its output.
fn ctl_ok(node: &Node, args: &[&str], stdin: &str) -> String {
    let (ok, out, err) = ctl(node.daemon.admin, args, stdin);
    assert!(ok, "meridian ctl {args:?} failed: {err}");
    out
}

/// Whether `user` (password `pw`) logs in at `port` now.
async fn logs_in(port: u16, user: &str) -> bool {
    let mut o = v5::options(&format!("probe-{user}-{}", free_port()), port);
    o.set_credentials(user, "pw");
    let (client, mut eventloop) = rumqttc::v5::AsyncClient::new(o, 10);
    let answer = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            match eventloop.poll().await {
                Ok(rumqttc::v5::Event::Incoming(rumqttc::v5::mqttbytes::v5::Packet::ConnAck(
                    ack,
                ))) => {
                    return ack.code == rumqttc::v5::mqttbytes::v5::ConnectReturnCode::Success;
                }
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    let _ = client.disconnect().await;
    answer
}

/// Three regions, each link through a proxy, every node seeded with user alice (password
/// `pw`) and no anonymous logins, each named after its region.
async fn three() -> (Vec<Node>, Vec<Proxy>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let passwords = dir.path().join("passwords");
    std::fs::write(&passwords, format!("alice:{}\n", cheap_hash("pw"))).unwrap();
    let extra = |region: &str| {
        format!(
            "\n[node]\nname = \"node-{region}\"\n[auth]\npassword_file = \"{}\"\n\
             allow_anonymous = false\n",
            passwords.display()
        )
    };
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let ab = Proxy::start(pa).await.unwrap();
    let ac = Proxy::start(pa).await.unwrap();
    let bc = Proxy::start(pb).await.unwrap();
    let a = Node::start_with("euc1", pa, &[], &key, &extra("euc1")).await;
    let b = Node::start_with("ape1", pb, &[ab.port], &key, &extra("ape1")).await;
    let c = Node::start_with("afs1", pc, &[ac.port, bc.port], &key, &extra("afs1")).await;
    for (x, y) in [(&a, &b), (&a, &c), (&b, &c)] {
        wait_for("the mesh to connect", &[x, y], || async {
            x.connected_to(y).await && y.connected_to(x).await
        })
        .await;
    }
    (vec![a, b, c], vec![ab, ac, bc], dir)
}

/// A node's policy as its admin API shows it.
async fn policy(node: &Node) -> serde_json::Value {
    let (status, body) = http(node.daemon.admin, "GET", "/api/policy").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn v3_login(id: &str, port: u16, user: &str) -> rumqttc::MqttOptions {
    let mut o = v3::options(id, port);
    o.set_credentials(user, "pw");
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_rules_edited_in_one_region_are_in_force_in_every_region() {
    let (nodes, _proxies, _dir) = three().await;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    assert!(!logs_in(c.mqtt(), "carol").await);

    // Added in region a: carol logs in at c, once the document got there.
    let out = ctl_ok(a, &["user", "add", "carol"], "pw\n");
    assert_eq!(out.trim(), "done: user set carol");
    let done = std::time::Instant::now();
    wait_for("carol to log in at c", &[a, c], || {
        logs_in(c.mqtt(), "carol")
    })
    .await;
    // A figure, not a bound (`--nocapture` shows it).
    eprintln!(
        "policy: a user added in euc1 logged in at afs1 {:?} after the edit was acknowledged \
         (the login's own password check included)",
        done.elapsed()
    );
    assert!(logs_in(b.mqtt(), "carol").await);

    // A rule added in a denies a client at c.
    let mut early = v3::connect(v3_login("early", c.mqtt(), "carol")).await;
    early.subscribe("secret/plans", QoS::AtLeastOnce).await;
    early.subscribe("open/news", QoS::AtLeastOnce).await;
    wait_for("a to route both to c", &[a, c], || async {
        a.routes_of(c).await.len() == 2
    })
    .await;
    ctl_ok(a, &["acl", "add", "deny", "subscribe", "secret/#"], "");
    wait_for(
        "the rule to refuse carol's subscription at c",
        &[a, c],
        || async {
            let mut probe = v3::connect(v3_login(
                &format!("probe-{}", free_port()),
                c.mqtt(),
                "carol",
            ))
            .await;
            probe
                .client
                .subscribe("secret/x", QoS::AtLeastOnce)
                .await
                .unwrap();
            let refused = probe
                .expect(|p| match p {
                    rumqttc::Packet::SubAck(ack) => Some(
                        ack.return_codes
                            .iter()
                            .all(|r| matches!(r, rumqttc::SubscribeReasonCode::Failure)),
                    ),
                    _ => None,
                })
                .await;
            probe.abort();
            refused
        },
    )
    .await;
    // The subscription made before the rule stays, and the rule decides each delivery: the
    // message published first never comes.
    let publisher = v3::connect(v3_login("pub", a.mqtt(), "alice")).await;
    for topic in ["secret/plans", "open/news"] {
        publisher
            .client
            .publish(topic, QoS::AtLeastOnce, false, topic)
            .await
            .unwrap();
    }
    let got = next_publish(&mut early, |_| true).await;
    assert_eq!(
        got.topic, "open/news",
        "nothing under secret/ was delivered"
    );

    // Removed in region b: refused at c.
    ctl_ok(b, &["user", "remove", "carol"], "");
    wait_for("carol to be refused at c", &[b, c], || async {
        !logs_in(c.mqtt(), "carol").await
    })
    .await;

    // Every node lists the same rules, and c's history says who did what, where and when.
    let listed = ctl_ok(c, &["acl", "list"], "");
    assert!(listed.contains("1  deny subscribe secret/#"), "{listed}");
    let history = ctl_ok(c, &["history"], "");
    let line = |what: &str| {
        history
            .lines()
            .find(|l| l.ends_with(what))
            .unwrap_or_else(|| panic!("no {what:?} in the history:\n{history}"))
            .to_owned()
    };
    let added = line("user set carol");
    assert!(added.contains("node-euc1") && added.contains("euc1") && added.contains("local"));
    assert!(line("acl add deny subscribe secret/#").contains("node-euc1"));
    assert!(line("user remove carol").contains("node-ape1"));
    assert!(history.contains("user set alice"), "the seed: {history}");
    let year = &added[..4];
    assert!(
        year.parse::<u32>().is_ok_and(|y| y >= 2024),
        "a date: {added}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_residency_rule_keeps_messages_in_its_regions() {
    let (nodes, _proxies, _dir) = three().await;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    ctl_ok(b, &["residency", "add", "health/#", "euc1", "ape1"], "");
    for n in [a, c] {
        wait_for("the rule everywhere", &[n], || async {
            policy(n).await["residency"][0]["filter"] == "health/#"
        })
        .await;
    }

    // A subscriber inside the rule's regions (b) and one outside (c, every topic).
    let mut inside = v3::connect(v3_login("inside", b.mqtt(), "alice")).await;
    inside.subscribe("health/#", QoS::AtLeastOnce).await;
    let mut outside = v3::connect(v3_login("outside", c.mqtt(), "alice")).await;
    outside.subscribe("#", QoS::AtLeastOnce).await;
    wait_for(
        "a to route health/# to b and # to c",
        &[a, b, c],
        || async {
            a.routes_of(b).await.iter().any(|f| f == "health/#")
                && a.routes_of(c).await.iter().any(|f| f == "#")
        },
    )
    .await;
    assert!(
        !c.routes_of(b).await.iter().any(|f| f == "health/#"),
        "b's subscription is never advertised to c"
    );

    let publisher = v3::connect(v3_login("pub", a.mqtt(), "alice")).await;
    for i in 0..20 {
        publisher
            .client
            .publish("health/p1", QoS::AtLeastOnce, false, format!("h{i}"))
            .await
            .unwrap();
    }
    publisher
        .client
        .publish("news/today", QoS::AtLeastOnce, false, "news")
        .await
        .unwrap();
    for i in 0..20 {
        let p = next_publish(&mut inside, |_| true).await;
        assert_eq!(
            p.payload,
            format!("h{i}").as_bytes(),
            "b gets everything, in order"
        );
    }
    // The news crossed to c after the health messages were routed: none of them came first.
    let first = next_publish(&mut outside, |_| true).await;
    assert_eq!(first.topic, "news/today");
    wait_for("a to count what it kept home", &[a], || async {
        metric(&a.metrics().await, "meridian_residency_withheld_total") >= 20.0
    })
    .await;
    assert_eq!(
        metric(&c.metrics().await, "meridian_residency_withheld_total"),
        0.0
    );
    // The forward counters say the same: 20 to b, the news alone to c.
    assert_eq!(
        a.peer_metric("meridian_forward_sent_messages_total", b)
            .await,
        20.0
    );
    assert_eq!(
        a.peer_metric("meridian_forward_sent_messages_total", c)
            .await,
        1.0
    );
    assert_eq!(
        c.peer_metric("meridian_forward_received_messages_total", a)
            .await,
        1.0
    );

    // Removed in c: health crosses to c again.
    ctl_ok(c, &["residency", "remove", "health/#"], "");
    wait_for("a to drop the rule", &[a], || async {
        policy(a).await["residency"]
            .as_array()
            .is_some_and(Vec::is_empty)
    })
    .await;
    // A node's document changes first; then the change goes to its broker task, ahead of
    // what its clients send next: wait for the brokers to have it in force.
    wait_for(
        "a's and c's brokers to have no rule left",
        &[a, c],
        || async {
            let mut left = Vec::new();
            for n in [a, c] {
                left.push(
                    node_info(n.daemon.admin).await["policy_in_force"]["residency_rules"].clone(),
                );
            }
            left.iter().all(|rules| *rules == 0)
        },
    )
    .await;
    publisher
        .client
        .publish("health/p2", QoS::AtLeastOnce, false, "after")
        .await
        .unwrap();
    let p = next_publish(&mut outside, |_| true).await;
    assert_eq!(p.topic, "health/p2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_on_both_sides_of_a_cut_link_converge_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pc) = (free_port(), free_port());
    let link = Proxy::start(pa).await.unwrap();
    let a = Node::start("euc1", pa, &[], &key).await;
    let c = Node::start("afs1", pc, &[link.port], &key).await;
    let both = [&a, &c];
    wait_for("the link", &both, || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;
    ctl_ok(&a, &["user", "add", "frank"], "pw\n");
    wait_for("frank at c", &both, || async {
        policy(&c).await["users"] == serde_json::json!(["frank"])
    })
    .await;

    link.cut();
    wait_for("the cut", &both, || async { !c.connected_to(&a).await }).await;
    // Meanwhile, on each side: new users, the same rule with opposite permissions, frank
    // removed on one side and given a new password on the other, and two residency rules
    // for one filter.
    ctl_ok(&a, &["user", "add", "dave"], "pw\n");
    ctl_ok(&c, &["user", "add", "erin"], "pw\n");
    ctl_ok(&a, &["acl", "add", "allow", "subscribe", "y/#"], "");
    ctl_ok(&c, &["acl", "add", "deny", "subscribe", "y/#"], "");
    ctl_ok(&a, &["user", "remove", "frank"], "");
    ctl_ok(&c, &["user", "passwd", "frank"], "other\n");
    ctl_ok(&a, &["residency", "add", "h/#", "euc1", "afs1"], "");
    ctl_ok(&c, &["residency", "add", "h/#", "afs1", "ape1"], "");
    assert_ne!(policy(&a).await, policy(&c).await);

    link.restore();
    wait_for("both sides to say the same", &both, || async {
        policy(&a).await == policy(&c).await
    })
    .await;
    let p = policy(&a).await;
    assert_eq!(
        p["users"],
        serde_json::json!(["dave", "erin"]),
        "frank stays removed"
    );
    assert_eq!(
        p["acl"],
        serde_json::json!([{"permission": "deny", "action": "subscribe", "topic": "y/#"}]),
        "a deny beats a concurrent allow"
    );
    assert_eq!(
        p["residency"],
        serde_json::json!([{"filter": "h/#", "regions": ["afs1"]}]),
        "only the region both allowed"
    );
    // In force, not only listed: dave logs in at c, frank nowhere.
    assert!(logs_in(c.mqtt(), "dave").await);
    assert!(!logs_in(a.mqtt(), "frank").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_answers_the_document_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, "seeded-token-0123456789\n").unwrap();
    let config = format!("[admin]\ntoken_file = \"{}\"\n", token_file.display());
    let mut d = Daemon::start_with(Some(&config), Vec::new());
    let admin = d.admin;
    let file = token_file.to_str().unwrap();
    let with_seed = |args: &[&str]| {
        let mut all = vec!["--token-file", file];
        all.extend_from_slice(args);
        ctl(admin, &all, "")
    };
    // The file seeded the document's first token; without a token, nothing.
    let (ok, out, _) = with_seed(&["token", "list"]);
    assert!(ok, "{out}");
    let seeded = out
        .trim()
        .strip_prefix("admin  ")
        .expect("one admin token")
        .to_owned();
    assert!(
        seeded.starts_with("token-file-") && seeded.len() == 19,
        "{seeded}"
    );
    assert!(!ctl(admin, &["token", "list"], "").0);

    // A new token, printed once, works at once; the seeded one, revoked, does not.
    let (ok, new_token, err) = with_seed(&["token", "add", "admin", "ops"]);
    assert!(ok, "{err}");
    let new_token = new_token.trim().to_owned();
    assert_eq!(new_token.len(), 64);
    let ops_file = dir.path().join("ops.token");
    std::fs::write(&ops_file, &new_token).unwrap();
    let ops = ops_file.to_str().unwrap();
    let (ok, out, err) = ctl(
        admin,
        &["--token-file", ops, "token", "remove", "admin", &seeded],
        "",
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), format!("done: token remove admin {seeded}"));
    let (ok, _, err) = with_seed(&["token", "list"]);
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, history, _) = ctl(admin, &["--token-file", ops, "history"], "");
    assert!(ok);
    assert!(
        history
            .lines()
            .any(|l| l.contains(" ops ") && l.ends_with(&format!("token remove admin {seeded}"))),
        "the history names the token that did it:\n{history}"
    );
    assert!(!history.contains(&new_token), "no secret in the history");

    // Bad edits are refused with the reason; removing what is not there is a 404.
    let (ok, _, err) = ctl(
        admin,
        &[
            "--token-file",
            ops,
            "acl",
            "add",
            "deny",
            "subscribe",
            "a/#/b",
        ],
        "",
    );
    assert!(!ok && err.contains("400"), "{err}");
    let (ok, _, err) = ctl(
        admin,
        &["--token-file", ops, "user", "remove", "nobody"],
        "",
    );
    assert!(
        !ok && err.contains("404") && err.contains("nobody"),
        "{err}"
    );

    // The document outlives a restart; the token file is not read again.
    std::fs::write(&token_file, "another-token-0123456789\n").unwrap();
    d.terminate();
    d.restart();
    let (ok, out, _) = ctl(admin, &["--token-file", ops, "token", "list"], "");
    assert!(ok && out.trim() == "admin  ops", "{out}");
    let (ok, _, _) = with_seed(&["token", "list"]);
    assert!(!ok, "the file's new token was not taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_is_compacted_once_every_node_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let (pa, pc) = (free_port(), free_port());
    let link = Proxy::start(pa).await.unwrap();
    let compact = "\n[policy]\ncompact_after_changes = 5\ncompact_interval_ms = 100\n";
    let a = Node::start_with("euc1", pa, &[], &key, compact).await;
    let c = Node::start_with("afs1", pc, &[link.port], &key, compact).await;
    let both = [&a, &c];
    wait_for("the link", &both, || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;
    // Compaction waits for the nodes the document lists: both, once the documents met.
    wait_for("both nodes in both documents", &both, || async {
        let listed = |p: serde_json::Value| p["nodes"].as_array().map_or(0, Vec::len);
        listed(policy(&a).await) == 2 && listed(policy(&c).await) == 2
    })
    .await;
    // The node that compacts: the smaller peer id.
    let (coordinator, other) = if a.peer_id < c.peer_id {
        (&a, &c)
    } else {
        (&c, &a)
    };

    // While the other node cannot be reached, enough edits are made on both sides, and the
    // coordinator waits.
    link.cut();
    wait_for("the cut", &both, || async { !c.connected_to(&a).await }).await;
    for i in 0..6 {
        ctl_ok(coordinator, &["user", "add", &format!("u{i}")], "pw\n");
    }
    ctl_ok(other, &["acl", "add", "deny", "publish", "ro/#"], "");
    wait_for(
        "the coordinator to wait for the other node",
        &both,
        || async {
            policy(coordinator).await["compaction_waits_for"]
                .as_array()
                .is_some_and(|w| w.iter().any(|n| *n == other.peer_id.as_str()))
        },
    )
    .await;
    assert_eq!(policy(coordinator).await["epoch"], 0);

    // Linked again: the documents merge, then the coordinator compacts, and both take the
    // new epoch with every edit in it.
    link.restore();
    wait_for("epoch 1 on both nodes, the same", &both, || async {
        let (pa, pc) = (policy(&a).await, policy(&c).await);
        pa["epoch"] == 1 && pc["epoch"] == 1 && pa == pc
    })
    .await;
    let p = policy(&a).await;
    assert_eq!(p["users"].as_array().unwrap().len(), 6);
    assert_eq!(p["acl"][0]["topic"], "ro/#");
    assert!(
        policy(coordinator).await["compaction_waits_for"]
            .as_array()
            .is_some_and(Vec::is_empty),
        "waiting for no node any more"
    );
    // The history is still there to read, and edits go on in the new epoch.
    let history = ctl_ok(other, &["history"], "");
    assert!(history.contains("user set u5"), "{history}");
    assert!(history.contains("acl add deny publish ro/#"), "{history}");
    ctl_ok(other, &["user", "remove", "u0"], "");
    wait_for("the removal at the coordinator", &both, || async {
        policy(coordinator).await["users"].as_array().unwrap().len() == 5
    })
    .await;
    assert!(logs_in(coordinator.mqtt(), "u1").await);
}

/// A deployment's files with an operator key: the directory, the cluster key, the operator
/// key, its public half and the `[policy]` section that lists it (for a node's config).
struct Operated {
    dir: tempfile::TempDir,
    key: std::path::PathBuf,
    op_key: std::path::PathBuf,
    public: String,
    signed: String,
}

fn operated() -> Operated {
    let dir = tempfile::tempdir().unwrap();
    let key = cluster_key(dir.path(), "cluster.key");
    let op_key = dir.path().join("operator.key");
    let public = operator_keygen(&op_key);
    let signed = format!("\n[policy]\noperator_keys = [\"{public}\"]\n");
    Operated {
        dir,
        key,
        op_key,
        public,
        signed,
    }
}

/// `meridian keygen --operator FILE`: the public key it prints.
fn operator_keygen(path: &std::path::Path) -> String {
    meridian(&["keygen", "--operator", path.to_str().unwrap()])
}

/// A deployment with an operator key: only what the operator signs makes policy. A rogue node
/// holding the cluster key (the released binary, with a configuration of its own and no
/// operator keys) mints an admin token and sets alice's password on its own document; no
/// other node takes either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_operator_key_a_node_holding_the_cluster_key_makes_no_policy() {
    let Operated {
        dir,
        key,
        op_key,
        public,
        signed,
    } = operated();
    let op = op_key.to_str().unwrap();
    let (pa, pc, pr) = (free_port(), free_port(), free_port());
    let ac = Proxy::start(pa).await.unwrap();
    let ra = Proxy::start(pa).await.unwrap();
    let a = Node::start_with("euc1", pa, &[], &key, &signed).await;
    let c = Node::start_with("afs1", pc, &[ac.port], &key, &signed).await;
    wait_for("the mesh to connect", &[&a, &c], || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;

    // An admin token no longer makes policy; the operator key does.
    let (ok, _, err) = ctl(a.daemon.admin, &["user", "add", "alice"], "pw\n");
    assert!(!ok && err.contains("--operator-key"), "{err}");
    ctl_ok(&a, &["--operator-key", op, "user", "add", "alice"], "pw\n");
    let token = ctl_ok(
        &a,
        &["--operator-key", op, "token", "add", "admin", "ops"],
        "",
    );
    let token = token.trim().to_owned();
    wait_for("alice and the token at c", &[&a, &c], || async {
        let p = policy_with(&c, &token).await;
        p["users"] == serde_json::json!(["alice"])
            && p["admin_tokens"] == serde_json::json!(["ops"])
    })
    .await;
    assert!(logs_in(c.mqtt(), "alice").await);
    // A key the nodes do not list signs nothing they take: a change (POST
    // /api/policy/changes) or a next epoch (POST /api/policy/epoch), with an admin token.
    let rogue_key = dir.path().join("rogue-operator.key");
    operator_keygen(&rogue_key);
    let rogue = rogue_key.to_str().unwrap();
    let tf = write_token(&dir, &token);
    let with = |args: &[&'static str]| {
        let mut v = vec!["--token-file", tf.as_str(), "--operator-key", rogue];
        v.extend_from_slice(args);
        v
    };
    let (ok, _, err) = ctl(a.daemon.admin, &with(&["user", "add", "mallory"]), "pw\n");
    assert!(!ok && err.contains("403"), "{err}");
    let (ok, _, err) = ctl(a.daemon.admin, &with(&["policy", "compact"]), "");
    assert!(!ok && err.contains("403"), "{err}");
    let p = policy_with(&a, &token).await;
    assert_eq!(p["users"], serde_json::json!(["alice"]), "{p}");
    assert_eq!(p["epoch"], 0, "{p}");
    let history = ctl_ok(
        &c,
        &["--token-file", &write_token(&dir, &token), "history"],
        "",
    );
    assert!(history.contains(&public[..16]), "{history}");

    // The rogue: a node of its own with the cluster key and no operator keys, linked to a.
    let rogue = Node::start_with("xx1", pr, &[ra.port], &key, "").await;
    let (ok, pwn, _) = ctl(rogue.daemon.admin, &["token", "add", "admin", "pwn"], "");
    assert!(ok, "the rogue's own document takes it");
    let pwn_file = dir.path().join("pwn.token");
    std::fs::write(&pwn_file, &pwn).unwrap();
    let with_pwn = ["--token-file", pwn_file.to_str().unwrap()];
    let (ok, _, err) = ctl(
        rogue.daemon.admin,
        &[&with_pwn[..], &["user", "passwd", "alice"]].concat(),
        "stolen\n",
    );
    assert!(ok, "{err}");
    wait_for("a to refuse the rogue's policy", &[&a], || async {
        metric(
            &metrics_with(&a, &token).await,
            "meridian_policy_sync_refused_total",
        ) >= 1.0
    })
    .await;
    let bearer = |t: &str| format!("Bearer {}", t.trim());
    let ask = |port: u16, t: String| async move {
        common::http_with(
            port,
            "GET",
            "/api/clients",
            &[("host", "127.0.0.1"), ("authorization", &t)],
        )
        .await
        .0
    };
    for node in [&a, &c] {
        assert_eq!(ask(node.daemon.admin, bearer(&pwn)).await, 401);
        assert_eq!(ask(node.daemon.admin, bearer(&token)).await, 200);
        let p = policy_with(node, &token).await;
        assert_eq!(p["admin_tokens"], serde_json::json!(["ops"]), "{p}");
        assert!(logs_in(node.mqtt(), "alice").await, "alice's own password");
    }

    // The operator compacts: the next epoch, signed, reaches c.
    let out = ctl_ok(
        &a,
        &[
            "--token-file",
            &write_token(&dir, &token),
            "--operator-key",
            op,
            "policy",
            "compact",
        ],
        "",
    );
    assert!(out.contains("epoch 1"), "{out}");
    wait_for("c to take epoch 1", &[&a, &c], || async {
        policy_with(&c, &token).await["epoch"] == 1
    })
    .await;
    assert!(logs_in(c.mqtt(), "alice").await);
    assert_eq!(
        metric(
            &metrics_with(&c, &token).await,
            "meridian_policy_task_restarts_total"
        ),
        0.0
    );
}

/// With an operator key, a forget counts for the deployment only if the operator signed it.
/// A node holding the cluster key (no operator key of its own) forgets a node that is down and
/// tells the others: they keep it (a region merely cut off keeps its backlog) and count the
/// announcement as `not_owner`. An honest node refuses a forget without the operator's
/// signature (403); the operator's `ctl --operator-key ... peers forget` there is honoured by
/// every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_operator_key_only_the_operator_forgets_a_node_for_the_deployment() {
    let Operated {
        dir,
        key,
        op_key,
        signed,
        ..
    } = operated();
    let op = op_key.to_str().unwrap();
    let (pa, pb, pc, pr) = (free_port(), free_port(), free_port(), free_port());
    let mut a = Node::start_with("euc1", pa, &[], &key, &signed).await;
    let b = Node::start_with("use1", pb, &[pa], &key, &signed).await;
    let c = Node::start_with("afs1", pc, &[pa, pb], &key, &signed).await;
    let rogue = Node::start_with("xx1", pr, &[pa, pc], &key, "").await;
    wait_for("the mesh to connect", &[&a, &b, &c, &rogue], || async {
        b.connected_to(&a).await
            && c.connected_to(&a).await
            && c.connected_to(&b).await
            && rogue.connected_to(&a).await
            && rogue.connected_to(&c).await
    })
    .await;
    let a_id = a.peer_id.clone();
    a.daemon.kill9();
    wait_for("a's links to go down", &[&b, &c, &rogue], || async {
        !b.connected_to(&a).await && !c.connected_to(&a).await && !rogue.connected_to(&a).await
    })
    .await;

    // The rogue's word: it forgets a itself, and the others keep it.
    let (ok, _, err) = ctl(rogue.daemon.admin, &["peers", "forget", &a.peer_id], "");
    assert!(ok, "the rogue forgets a for itself: {err}");
    let not_owner = "meridian_peer_frames_refused_total{reason=\"not_owner\"}";
    wait_for("c to refuse the rogue's announcement", &[&c], || async {
        metric(&c.metrics().await, not_owner) >= 1.0
    })
    .await;
    assert!(knows(&c, &a_id).await && knows(&b, &a_id).await);
    assert_eq!(
        metric(&c.metrics().await, "meridian_peers_forgotten_total"),
        0.0
    );

    // An honest node's admin API forgets only with the operator's signature.
    let (ok, _, err) = ctl(b.daemon.admin, &["peers", "forget", &a.peer_id], "");
    assert!(
        !ok && err.contains("403") && err.contains("--operator-key"),
        "{err}"
    );
    let rogue_key = dir.path().join("rogue-operator.key");
    operator_keygen(&rogue_key);
    let args = [
        "--operator-key",
        rogue_key.to_str().unwrap(),
        "peers",
        "forget",
    ];
    let (ok, _, err) = ctl(b.daemon.admin, &[&args[..], &[&a.peer_id]].concat(), "");
    assert!(
        !ok && err.contains("403"),
        "a key the nodes do not list: {err}"
    );
    assert!(knows(&b, &a_id).await);
    let out = ctl_ok(
        &b,
        &["--operator-key", op, "peers", "forget", &a.peer_id],
        "",
    );
    assert!(out.contains("forgot"), "{out}");
    wait_for("c to forget a on the operator's word", &[&c], || async {
        !knows(&c, &a_id).await
    })
    .await;
    assert_eq!(
        metric(&c.metrics().await, "meridian_peers_forgotten_total"),
        1.0
    );
}

/// With an operator key, a node's region is the operator's word: a certified node's region is
/// taken by its peers; a node holding the cluster key that names a region without a
/// certificate has none at the others (so no residency rule lets a restricted message go to
/// it), and its hello is counted; a node given another region's certificate does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_operator_key_a_node_s_region_is_the_operator_s_word() {
    let Operated {
        dir,
        key,
        op_key,
        signed,
        ..
    } = operated();
    let op = op_key.to_str().unwrap();
    // The operator certifies b's peer id (made before b first starts) in use1.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let b_id = meridian(&["peer-id", "--data-dir", data.to_str().unwrap()]);
    let cert = meridian(&[
        "certify",
        "--operator-key",
        op,
        "--peer-id",
        &b_id,
        "--region",
        "use1",
    ]);
    let cert_file = dir.path().join("b.cert");
    std::fs::write(&cert_file, format!("{cert}\n")).unwrap();
    let certified = format!("certificate = \"{}\"\n{signed}", cert_file.display());

    // Given to a node in another region, the certificate stops its start, naming the key.
    let config = dir.path().join("wrong.toml");
    std::fs::write(
        &config,
        format!(
            "[storage]\ndata_dir = \"{}\"\n[cluster]\nenabled = true\nregion = \"euc1\"\n\
             key_file = \"{}\"\nlisten = [\"/ip4/127.0.0.1/tcp/{}\"]\n{certified}",
            data.display(),
            key.display(),
            free_port()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["run", "--config", config.to_str().unwrap()])
        .output()
        .expect("run meridian");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("cluster.certificate") && err.contains("euc1"),
        "{err}"
    );

    let (pb, pc, pr) = (free_port(), free_port(), free_port());
    let c = Node::start_with("afs1", pc, &[], &key, &signed).await;
    let b = Node::launch_in(
        tmp,
        "use1",
        pb,
        &[pc],
        &key,
        // While the deployment's nodes are being certified, a certified node takes uncertified
        // ones as members (without a region): c has no certificate yet.
        &format!("discover = false\nmembers_certified = false\n{certified}"),
    )
    .await;
    assert_eq!(b.peer_id, b_id);
    // The rogue names the region of its choice, with no certificate.
    let rogue = Node::start_with("use1", pr, &[pc], &key, "").await;
    wait_for("the mesh to connect", &[&b, &c, &rogue], || async {
        c.connected_to(&b).await && c.connected_to(&rogue).await
    })
    .await;
    let region_at_c = |peer: &str| {
        let peer = peer.to_owned();
        let c = &c;
        async move {
            c.peers()
                .await
                .into_iter()
                .find(|p| p["peer_id"] == peer.as_str())
                .map(|p| p["region"].clone())
        }
    };
    wait_for("c to take b's region", &[&c], || async {
        region_at_c(&b.peer_id).await == Some(serde_json::json!("use1"))
    })
    .await;
    assert_eq!(
        region_at_c(&rogue.peer_id).await,
        Some(serde_json::Value::Null)
    );
    let not_owner = "meridian_peer_frames_refused_total{reason=\"not_owner\"}";
    assert!(metric(&c.metrics().await, not_owner) >= 1.0);
}

/// A node in `region` with the operator's certificate of its peer id (made before its first
/// start), taking only certified peers as members.
async fn certified_member(
    op_key: &std::path::Path,
    key: &std::path::Path,
    signed: &str,
    region: &str,
    p2p: u16,
    peers: &[u16],
) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let id = meridian(&["peer-id", "--data-dir", data.to_str().unwrap()]);
    let op = op_key.to_str().unwrap();
    let cert = meridian(&[
        "certify",
        "--operator-key",
        op,
        "--peer-id",
        &id,
        "--region",
        region,
    ]);
    let cert_file = tmp.path().join("node.cert");
    std::fs::write(&cert_file, format!("{cert}\n")).unwrap();
    // `cluster.members_certified` is left to its default: on, with operator keys and a certificate.
    let extra = format!("certificate = \"{}\"\n{signed}", cert_file.display());
    Node::launch_in(tmp, region, p2p, peers, key, &extra).await
}

/// With operator keys and certificates (and `cluster.members_certified` at its default), a node
/// that holds the cluster key but no certificate of the operator's (the released binary, started by someone who stole the key) is no member:
/// the certified nodes mesh and exchange messages, the rogue's hellos are refused and counted,
/// and nothing is forwarded to it or taken from it, whatever it subscribes; nor does the policy
/// document reach it (its users, their hashes and keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_certified_members_a_node_without_a_certificate_is_no_member() {
    let Operated {
        dir: _dir,
        key,
        op_key,
        signed,
        ..
    } = operated();
    let (pa, pb, pr) = (free_port(), free_port(), free_port());
    let a = certified_member(&op_key, &key, &signed, "euc1", pa, &[]).await;
    let b = certified_member(&op_key, &key, &signed, "use1", pb, &[pa]).await;
    let rogue = Node::start_with("afs1", pr, &[pa, pb], &key, "").await;
    wait_for("the certified nodes to mesh", &[&a, &b], || async {
        a.connected_to(&b).await && b.connected_to(&a).await
    })
    .await;
    let not_owner = "meridian_peer_frames_refused_total{reason=\"not_owner\"}";
    wait_for(
        "both to refuse the rogue's hello",
        &[&a, &b, &rogue],
        || async {
            metric(&a.metrics().await, not_owner) >= 1.0
                && metric(&b.metrics().await, not_owner) >= 1.0
        },
    )
    .await;
    // A user added now reaches b; the policy streams a and b keep opening to the rogue are
    // refused before anything is synced (once more after the user came, at least).
    let refused = "meridian_p2p_policy_streams_refused_total";
    let refused_before = metric(&a.metrics().await, refused) + metric(&b.metrics().await, refused);
    let op = op_key.to_str().unwrap();
    ctl_ok(&a, &["--operator-key", op, "user", "add", "alice"], "pw\n");
    wait_for("alice's entry at b", &[&a, &b], || async {
        common::http(b.daemon.admin, "GET", "/api/policy")
            .await
            .1
            .contains("alice")
    })
    .await;
    wait_for(
        "a policy stream to the rogue refused",
        &[&a, &b],
        || async {
            metric(&a.metrics().await, refused) + metric(&b.metrics().await, refused)
                > refused_before
        },
    )
    .await;
    // The rogue subscribes first: were it a member, its route would reach a before b's.
    let mut at_rogue = v3::connect(v3::options("rogue-sub", rogue.mqtt())).await;
    at_rogue.subscribe("#", QoS::AtLeastOnce).await;
    let mut at_b = v3::connect(v3::options("b-sub", b.mqtt())).await;
    at_b.subscribe("t/#", QoS::AtLeastOnce).await;
    let publisher = v3::connect(v3::options("a-pub", a.mqtt())).await;
    wait_for("b's route at a", &[&a, &b], || async {
        a.peers()
            .await
            .iter()
            .any(|p| p["peer_id"] == b.peer_id.as_str() && p["routes"].as_u64() >= Some(1))
    })
    .await;
    for i in 0..5 {
        publisher
            .client
            .publish("t/y", QoS::AtLeastOnce, false, format!("{i}"))
            .await
            .unwrap();
        assert_eq!(at_b.publish_msg().await.topic, "t/y");
    }
    // Nothing went to the rogue, nothing of it counts.
    let peers = a.peers().await;
    let to_rogue = peers
        .iter()
        .find(|p| p["peer_id"] == rogue.peer_id.as_str());
    assert!(
        to_rogue.is_none_or(|p| p["forwarded_to"] == 0 && p["routes"] == 0),
        "{peers:?}"
    );
    let (_, routes) = common::http(a.daemon.admin, "GET", "/api/routes").await;
    assert!(
        !routes.contains("\"#\""),
        "the rogue's # is nobody's interest: {routes}"
    );
    let (_, at_rogue_policy) = common::http(rogue.daemon.admin, "GET", "/api/policy").await;
    assert!(
        !at_rogue_policy.contains("alice"),
        "the policy document reached the rogue: {at_rogue_policy}"
    );
    publisher.disconnect().await;
    at_b.disconnect().await;
    at_rogue.disconnect().await;
}

/// Whether `node` knows the node `peer_id` (linked or not).
async fn knows(node: &Node, peer_id: &str) -> bool {
    node.peers().await.iter().any(|p| p["peer_id"] == peer_id)
}

/// `token` in a file, for `--token-file`.
fn write_token(dir: &tempfile::TempDir, token: &str) -> String {
    let path = dir.path().join("ops.token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A node's metrics page, asking with an admin token.
async fn metrics_with(node: &Node, token: &str) -> String {
    common::http_with(
        node.daemon.admin,
        "GET",
        "/metrics",
        &[
            ("host", "127.0.0.1"),
            ("authorization", &format!("Bearer {token}")),
        ],
    )
    .await
    .1
}

/// [`policy`], asking with an admin token.
async fn policy_with(node: &Node, token: &str) -> serde_json::Value {
    let (status, body) = common::http_with(
        node.daemon.admin,
        "GET",
        "/api/policy",
        &[
            ("host", "127.0.0.1"),
            ("authorization", &format!("Bearer {token}")),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// The documented way from a deployment without operator keys to one with them: users added
/// before are unsigned; with keys set on every node and the nodes restarted, each keeps its own
/// document in force (alice still logs in everywhere), then the operator's `policy compact` on
/// one node signs it as the next epoch, which every node takes; from then on an unsigned edit
/// is refused and a signed one reaches every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_turns_operator_keys_on_by_one_signed_compaction() {
    let Operated {
        dir,
        key,
        op_key,
        signed,
        ..
    } = operated();
    let (pa, pc) = (free_port(), free_port());
    let mut a = Node::start_with("euc1", pa, &[], &key, "").await;
    let mut c = Node::start_with("afs1", pc, &[pa], &key, "").await;
    wait_for("the mesh to connect", &[&a, &c], || async {
        a.connected_to(&c).await && c.connected_to(&a).await
    })
    .await;
    ctl_ok(&a, &["user", "add", "alice"], "pw\n");
    wait_for("alice at c", &[&a, &c], || async {
        common::http(c.daemon.admin, "GET", "/api/policy")
            .await
            .1
            .contains("alice")
    })
    .await;

    // Keys on every node, and a restart.
    for node in [&mut a, &mut c] {
        node.kill9();
        let config = node.daemon.config.clone().expect("a config file");
        let mut body = std::fs::read_to_string(&config).unwrap();
        body.push_str(&signed);
        std::fs::write(&config, body).unwrap();
        node.restart().await;
    }
    for node in [&a, &c] {
        assert!(
            logs_in(node.mqtt(), "alice").await,
            "alice's entry stays in force"
        );
    }
    let token = ctl_ok(
        &a,
        &[
            "--operator-key",
            op_key.to_str().unwrap(),
            "token",
            "add",
            "admin",
            "ops",
        ],
        "",
    );
    let tf = write_token(&dir, token.trim());
    let op = op_key.to_str().unwrap();
    let out = ctl_ok(
        &a,
        &[
            "--token-file",
            &tf,
            "--operator-key",
            op,
            "policy",
            "compact",
        ],
        "",
    );
    assert!(out.contains("epoch 1"), "{out}");
    wait_for("c to take the signed epoch", &[&a, &c], || async {
        let p = policy_with(&c, token.trim()).await;
        p["epoch"] == 1 && p["signed"] == true && p["users"] == serde_json::json!(["alice"])
    })
    .await;
    assert!(logs_in(c.mqtt(), "alice").await);
    // Unsigned edits are refused; signed ones reach every node.
    let (ok, _, err) = ctl(
        a.daemon.admin,
        &["--token-file", &tf, "user", "add", "mallory"],
        "pw\n",
    );
    assert!(!ok && err.contains("--operator-key"), "{err}");
    ctl_ok(
        &a,
        &[
            "--token-file",
            &tf,
            "--operator-key",
            op,
            "user",
            "add",
            "bob",
        ],
        "pw\n",
    );
    wait_for("bob at c", &[&a, &c], || async {
        policy_with(&c, token.trim()).await["users"] == serde_json::json!(["alice", "bob"])
    })
    .await;
    assert!(logs_in(c.mqtt(), "bob").await);
}
