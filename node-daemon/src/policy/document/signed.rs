//! Changes signed by an operator key ([`crate::policy::operator`]): how `meridian ctl` makes
//! them, and how a node checks every change before it counts.
//!
//! A signed change's message is its note (the JSON every change carries: who, what, the
//! edits), then [`SIGNATURE_MARK`], then the signature as JSON. What is signed is the
//! change's digest: the automerge hash of the same change with only the note as its message.
//!
//! With operator keys, a document counts only if each of its changes is
//! - the genesis of its epoch (the same change on every node: nobody's statement), or
//! - signed by one of the keys;
//!
//! and a document of a later epoch also holds its base (the change that starts an epoch with
//! what the previous one said), signed. So a node that holds the cluster key but no operator
//! key can neither add a change nor start an epoch: it can only relay what the operator
//! signed.

use automerge::{ActorId, Automerge, Change, ChangeHash};

use super::{
    BASE_ACTOR, ChangeNote, DocError, EditError, GENESIS_ACTOR, PolicyDoc, genesis_hash, screen,
};
use crate::policy::operator::{OperatorKey, OperatorKeys, SIGNATURE_MARK, Signature};

/// Who a change of a signed document is from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signer {
    /// The genesis of the epoch: the same on every node.
    Genesis,
    /// An operator key (its public half, in hex).
    Operator(String),
}

/// A change's message: its note, and the signature after [`SIGNATURE_MARK`] if it has one.
pub(super) fn split_message(message: &str) -> (&str, Option<&str>) {
    match message.split_once(SIGNATURE_MARK) {
        Some((note, signature)) => (note, Some(signature)),
        None => (message, None),
    }
}

/// A change's note, signed or not.
pub(super) fn note_of(message: Option<&str>) -> Option<ChangeNote> {
    serde_json::from_str(split_message(message?).0).ok()
}

/// The signing key named in a change's message, unchecked (the history shows it; a node with
/// operator keys checked it when the change came in).
pub(super) fn signed_by(message: Option<&str>) -> Option<String> {
    let signature = split_message(message?).1?;
    serde_json::from_str::<Signature>(signature)
        .ok()
        .map(|s| s.key)
}

/// What an operator key signs for `change`: the hash it has with its note alone as message.
fn digest(change: &Change) -> Option<ChangeHash> {
    let mut expanded = change.decode();
    let note = split_message(expanded.message.as_deref()?).0.to_owned();
    expanded.message = Some(note);
    Some(Change::from(expanded).hash())
}

/// `change` (whose message is its note) signed with `key`.
fn sign(change: &Change, key: &OperatorKey) -> Option<Change> {
    let signature = key.sign(&digest(change)?.0);
    let mut expanded = change.decode();
    let note = expanded.message.take()?;
    expanded.message = Some(format!(
        "{note}{SIGNATURE_MARK}{}",
        serde_json::to_string(&signature).ok()?
    ));
    Some(Change::from(expanded))
}

/// Who `change` of a document of `epoch` is from, if it counts under `keys`.
pub fn verify_change(change: &Change, epoch: u64, keys: &OperatorKeys) -> Result<Signer, String> {
    // Only a change of the genesis actor can be the genesis: the document is made for it then.
    if change.actor_id().to_bytes() == GENESIS_ACTOR && Some(change.hash()) == genesis_hash(epoch) {
        return Ok(Signer::Genesis);
    }
    let unsigned = || format!("change {} is not signed by an operator key", change.hash());
    let message = change.message().ok_or_else(unsigned)?;
    let signature = split_message(message).1.ok_or_else(unsigned)?;
    let signature: Signature = serde_json::from_str(signature).map_err(|_| unsigned())?;
    let digest = digest(change).ok_or_else(unsigned)?;
    if keys.verify(&digest.0, &signature) {
        Ok(Signer::Operator(signature.key))
    } else {
        Err(format!(
            "change {} has a signature no operator key made",
            change.hash()
        ))
    }
}

/// The changes a peer's sync message (already through the [`screen`]) carries, decoded.
pub(super) fn changes_of(message: &automerge::sync::Message) -> Result<Vec<Change>, String> {
    let mut out = Vec::new();
    for chunk_list in message.changes.iter() {
        for (kind, chunk) in screen::split_chunks(chunk_list)? {
            if kind == screen::CHUNK_DOCUMENT {
                let doc = Automerge::load(chunk).map_err(|e| e.to_string())?;
                out.extend(doc.get_changes(&[]));
            } else {
                out.push(Change::from_bytes(chunk.to_vec()).map_err(|e| e.to_string())?);
            }
        }
    }
    Ok(out)
}

impl PolicyDoc {
    /// `edits` as one change signed with `key`, made on this document (left as it was): the
    /// change's bytes, or `None` if the edits change nothing.
    pub fn signed_change(
        &self,
        edits: &[super::Edit],
        author: &super::Author,
        now_ms: i64,
        key: &OperatorKey,
    ) -> Result<Option<Vec<u8>>, EditError> {
        let mut trial = self.clone();
        if !trial.apply(edits, author, now_ms)? {
            return Ok(None);
        }
        let change = trial
            .doc
            .get_last_local_change()
            .ok_or_else(|| EditError::Invalid("the edits made no change".to_owned()))?;
        let mut signed = sign(&change, key)
            .ok_or_else(|| EditError::Invalid("the change has no note to sign".to_owned()))?;
        Ok(Some(signed.bytes().into_owned()))
    }

    /// The next epoch's document made from this one ([`PolicyDoc::compacted`]), its base
    /// signed with `key`: what `meridian ctl policy compact` sends.
    pub fn compacted_signed(
        &mut self,
        author: &super::Author,
        now_ms: i64,
        retention_ms: u64,
        key: &OperatorKey,
    ) -> Result<Self, EditError> {
        let actor = ActorId::from(&[0u8; 16][..]);
        let mut next = self.compacted(author, now_ms, retention_ms, actor.clone());
        let base = next
            .doc
            .get_changes(&[])
            .into_iter()
            .find(|c| c.actor_id().to_bytes() == BASE_ACTOR)
            .ok_or_else(|| EditError::Invalid("the compacted document has no base".to_owned()))?;
        let base = sign(&base, key)
            .ok_or_else(|| EditError::Invalid("the base has no note to sign".to_owned()))?;
        let mut signed = Self::genesis_of(next.epoch, actor);
        signed
            .doc
            .apply_changes([base])
            .map_err(|e| EditError::Invalid(e.to_string()))?;
        signed.objs = super::genesis_objects(&signed.doc, signed.epoch)
            .map_err(|e| EditError::Invalid(e.to_string()))?;
        Ok(signed)
    }

    /// Check every change of this document against `keys` (the changes that are not the
    /// genesis or signed, at most ten of them, in the error); a document of a later epoch
    /// must also hold its base, signed.
    pub fn verify(&mut self, keys: &OperatorKeys) -> Result<(), DocError> {
        let epoch = self.epoch;
        let mut refused = Vec::new();
        let mut base = false;
        for change in self.doc.get_changes(&[]) {
            match verify_change(&change, epoch, keys) {
                Ok(Signer::Operator(_)) => base |= change.actor_id().to_bytes() == BASE_ACTOR,
                Ok(Signer::Genesis) => {}
                Err(e) => refused.push(e),
            }
        }
        if !refused.is_empty() {
            let count = refused.len();
            refused.truncate(10);
            return Err(DocError::Unsigned(format!(
                "{count} changes: {}",
                refused.join("; ")
            )));
        }
        if epoch > 0 && !base {
            return Err(DocError::Unsigned(format!(
                "epoch {epoch} without a signed base"
            )));
        }
        Ok(())
    }

    /// How many changes of this document do not count under `keys` (made before the
    /// deployment had operator keys).
    pub fn unsigned_changes(&mut self, keys: &OperatorKeys) -> usize {
        let epoch = self.epoch;
        self.doc
            .get_changes(&[])
            .into_iter()
            .filter(|c| verify_change(c, epoch, keys).is_err())
            .count()
    }

    /// Apply signed changes `meridian ctl` made: each must be signed by one of `keys`, and
    /// all that each depends on must be here already or among them. Refused whole otherwise,
    /// or if the document would grow past `max_bytes`. Returns whether the document changed.
    pub fn receive_changes(
        &mut self,
        changes: Vec<Change>,
        keys: &OperatorKeys,
        max_bytes: usize,
    ) -> Result<bool, DocError> {
        for change in &changes {
            verify_change(change, self.epoch, keys).map_err(DocError::Unsigned)?;
        }
        let hashes: Vec<ChangeHash> = changes.iter().map(Change::hash).collect();
        for change in &changes {
            for dep in change.deps() {
                if !hashes.contains(dep) && self.doc.get_change_meta_by_hash(dep).is_none() {
                    return Err(DocError::Behind(format!(
                        "change {} depends on {dep}, which this document does not hold (made on \
                         another epoch?)",
                        change.hash()
                    )));
                }
            }
        }
        let mut doc = self.doc.clone();
        doc.apply_changes(changes)
            .map_err(|e| DocError::Sync(e.to_string()))?;
        self.keep_trial(doc, max_bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;
    use crate::policy::document::{Author, Edit, Policy, RuleEntry};

    fn hash() -> &'static str {
        static H: OnceLock<String> = OnceLock::new();
        H.get_or_init(|| crate::passwd::hash(b"pw").unwrap())
    }

    fn operator() -> &'static OperatorKey {
        static K: OnceLock<OperatorKey> = OnceLock::new();
        K.get_or_init(OperatorKey::generate)
    }

    fn keys() -> OperatorKeys {
        OperatorKeys::parse(&[operator().public_hex()]).unwrap()
    }

    fn author() -> Author {
        Author {
            by: "ops".into(),
            node: "n".into(),
            region: "r".into(),
        }
    }

    fn doc(n: u8) -> PolicyDoc {
        PolicyDoc::genesis(ActorId::from(&[n; 16][..]))
    }

    fn user(name: &str) -> Edit {
        Edit::UserSet {
            name: name.into(),
            hash: hash().to_owned(),
            claim_key: None,
        }
    }

    fn deny(topic: &str) -> Edit {
        Edit::AclAdd {
            rule: RuleEntry {
                permission: "deny".into(),
                action: "subscribe".into(),
                topic: topic.into(),
                user: None,
                client_id: None,
            },
            before: None,
        }
    }

    /// A signed change made on `doc`, applied to it as the node would.
    fn signed(doc: &mut PolicyDoc, edit: Edit, key: &OperatorKey) -> Change {
        let bytes = doc
            .signed_change(&[edit], &author(), 1_000, key)
            .unwrap()
            .expect("a change");
        let change = Change::from_bytes(bytes).unwrap();
        doc.doc.apply_changes([change.clone()]).unwrap();
        change
    }

    #[test]
    fn changes_the_operator_signed_count_and_no_others() {
        let keys = keys();
        let mut ctl = doc(1);
        let mut node = doc(2);
        let good = signed(&mut ctl, user("alice"), operator());
        assert_eq!(
            verify_change(&good, 0, &keys),
            Ok(Signer::Operator(operator().public_hex()))
        );
        assert!(node.receive_changes(vec![good], &keys, 1 << 20).unwrap());
        assert!(node.policy().users.contains_key("alice"));

        // Signed by a key the node does not take.
        let rogue = OperatorKey::generate();
        let mut other = ctl.clone();
        let forged = signed(&mut other, deny("#"), &rogue);
        let e = node.receive_changes(vec![forged.clone()], &keys, 1 << 20);
        assert!(matches!(e, Err(DocError::Unsigned(_))), "{e:?}");
        // Unsigned, as a node or an admin token makes them.
        let mut unsigned = ctl.clone();
        unsigned
            .apply(&[user("mallory")], &author(), 2_000)
            .unwrap();
        let plain = unsigned.doc.get_last_local_change().unwrap();
        assert!(verify_change(&plain, 0, &keys).is_err());
        // The operator's signature moved onto another change.
        let mut moved = plain.decode();
        let signature = split_message(good_message(&ctl).as_str())
            .1
            .unwrap()
            .to_owned();
        moved.message = Some(format!(
            "{}{SIGNATURE_MARK}{signature}",
            moved.message.unwrap()
        ));
        let moved = Change::from(moved);
        assert!(verify_change(&moved, 0, &keys).is_err());
        // A batch with one bad change is refused whole.
        let mut ok_too = ctl.clone();
        let fine = signed(&mut ok_too, user("bob"), operator());
        let e = node.receive_changes(vec![fine, moved], &keys, 1 << 20);
        assert!(e.is_err());
        assert!(!node.policy().users.contains_key("bob"));
        assert!(!node.policy().users.contains_key("mallory"));
    }

    fn good_message(doc: &PolicyDoc) -> String {
        let mut d = doc.clone();
        d.doc
            .get_changes(&[])
            .into_iter()
            .filter_map(|c| c.message().map(str::to_owned))
            .find(|m| m.contains(SIGNATURE_MARK))
            .unwrap()
    }

    #[test]
    fn a_peer_s_sync_message_with_an_unsigned_change_is_refused() {
        let keys = keys();
        let mut rogue = doc(1);
        rogue
            .apply(
                &[Edit::TokenSet {
                    kind: crate::policy::document::TokenKind::Admin,
                    name: "pwn".into(),
                    hash: crate::policy::tokens::token_hash("0123456789abcdef0123"),
                }],
                &author(),
                1,
            )
            .unwrap();
        let mut node = doc(2);
        let (mut rs, mut ns) = (automerge::sync::State::new(), automerge::sync::State::new());
        // The node speaks first; the rogue answers with its change.
        let m = node.sync_message(&mut ns).unwrap();
        rogue.receive_sync(&mut rs, &m, 1 << 24, None).unwrap();
        let m = rogue.sync_message(&mut rs).unwrap();
        let e = node.receive_sync(&mut ns, &m, 1 << 24, Some(&keys));
        assert!(matches!(e, Err(DocError::Unsigned(_))), "{e:?}");
        assert!(node.policy().admin_tokens.is_empty());
        // Signed changes go through sync as they are.
        let mut ctl = doc(3);
        signed(&mut ctl, user("alice"), operator());
        let (mut cs, mut ns) = (automerge::sync::State::new(), automerge::sync::State::new());
        for _ in 0..4 {
            if let Some(m) = ctl.sync_message(&mut cs) {
                node.receive_sync(&mut ns, &m, 1 << 24, Some(&keys))
                    .unwrap();
            }
            if let Some(m) = node.sync_message(&mut ns) {
                ctl.receive_sync(&mut cs, &m, 1 << 24, Some(&keys)).unwrap();
            }
        }
        assert!(node.policy().users.contains_key("alice"));
    }

    #[test]
    fn a_later_epoch_counts_only_with_its_base_signed() {
        let keys = keys();
        let mut ctl = doc(1);
        signed(&mut ctl, user("alice"), operator());
        let mut next = ctl
            .compacted_signed(&author(), 5_000, 86_400_000, operator())
            .unwrap();
        assert_eq!(next.epoch(), 1);
        next.verify(&keys).unwrap();
        let mut loaded = PolicyDoc::load(&next.save(), ActorId::from(&[9u8; 16][..])).unwrap();
        loaded.verify(&keys).unwrap();
        assert!(loaded.policy().users.contains_key("alice"));
        // Compacted by a node, unsigned.
        let mut by_node = ctl.compacted(&author(), 5_000, 86_400_000, ActorId::random());
        assert!(matches!(by_node.verify(&keys), Err(DocError::Unsigned(_))));
        // A bare genesis of a far epoch: nobody's statement, but no base either.
        let mut far = PolicyDoc::genesis_of(i64::MAX as u64, ActorId::random());
        let e = far.verify(&keys);
        assert!(
            matches!(e, Err(DocError::Unsigned(ref w)) if w.contains("base")),
            "{e:?}"
        );
        // A signed base from the operator's key, but not the operator of this deployment.
        let mut rogue = ctl
            .compacted_signed(&author(), 5_000, 86_400_000, &OperatorKey::generate())
            .unwrap();
        assert!(rogue.verify(&keys).is_err());
    }

    /// One edit of the property test: what it does, and who makes it.
    #[derive(Debug, Clone)]
    enum Maker {
        Operator,
        Rogue,
        Unsigned,
    }

    fn edit_strategy() -> impl Strategy<Value = (Edit, Maker)> {
        let name = prop::sample::select(vec!["alice", "bob", "carol"]);
        let topic = prop::sample::select(vec!["a/#", "b/+", "c"]);
        let edit = prop_oneof![
            name.clone().prop_map(user),
            name.prop_map(|n| Edit::UserRemove { name: n.into() }),
            topic.prop_map(deny),
        ];
        let maker = prop_oneof![
            Just(Maker::Operator),
            Just(Maker::Rogue),
            Just(Maker::Unsigned)
        ];
        (edit, maker)
    }

    /// The documents the property tests start from: the operator's, the rogue's (the
    /// operator's changes, and its own on top of whatever it saw), the operator's alone for
    /// reference, and every change made, in the order made.
    struct Made {
        ops: PolicyDoc,
        rogue: PolicyDoc,
        reference: PolicyDoc,
        all: Vec<Change>,
    }

    fn made(edits: Vec<(Edit, Maker)>) -> Made {
        let rogue_key = OperatorKey::generate();
        let mut ops = doc(1);
        let mut rogue = doc(2);
        let mut all: Vec<Change> = Vec::new();
        let mut reference = doc(3);
        for (i, (edit, maker)) in edits.into_iter().enumerate() {
            let t = 1_000 + i64::try_from(i).unwrap();
            match maker {
                Maker::Operator => {
                    if let Ok(Some(bytes)) = ops.signed_change(&[edit], &author(), t, operator()) {
                        let c = Change::from_bytes(bytes).unwrap();
                        ops.doc.apply_changes([c.clone()]).unwrap();
                        reference.doc.apply_changes([c.clone()]).unwrap();
                        // The rogue sees it, and builds on it.
                        rogue.doc.apply_changes([c.clone()]).unwrap();
                        all.push(c);
                    }
                }
                Maker::Rogue => {
                    if let Ok(Some(bytes)) = rogue.signed_change(&[edit], &author(), t, &rogue_key)
                    {
                        let c = Change::from_bytes(bytes).unwrap();
                        rogue.doc.apply_changes([c.clone()]).unwrap();
                        all.push(c);
                    }
                }
                Maker::Unsigned => {
                    if rogue.apply(&[edit], &author(), t).unwrap_or(false) {
                        all.push(rogue.doc.get_last_local_change().unwrap());
                    }
                }
            }
        }
        Made {
            ops,
            rogue,
            reference,
            all,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Changes from the operator, from a rogue key and unsigned ones, some made on top of
        /// others, reach a node one at a time in any order, again until none counts more:
        /// the node's policy is what the operator's changes alone make.
        #[test]
        fn only_the_operator_s_changes_make_the_policy(
            edits in prop::collection::vec(edit_strategy(), 1..16),
            order in any::<prop::sample::Index>(),
            seed in any::<u64>(),
        ) {
            let keys = keys();
            let Made { mut all, reference, .. } = made(edits);
            // Any order: rotate, then a seeded shuffle.
            let n = all.len().max(1);
            let by = order.index(n) % n;
            if !all.is_empty() {
                all.rotate_left(by);
            }
            let mut state = seed | 1;
            for i in (1..all.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                all.swap(i, usize::try_from(state % (i as u64 + 1)).unwrap());
            }
            let mut node = doc(4);
            loop {
                let mut progress = false;
                for c in &all {
                    if node.receive_changes(vec![c.clone()], &keys, 1 << 24).unwrap_or(false) {
                        progress = true;
                    }
                }
                if !progress {
                    break;
                }
            }
            let got: Policy = node.policy();
            prop_assert_eq!(got, reference.policy(), "seed {}", seed);
        }

        /// The same changes reach a node by sync, from two peers in a seeded interleaving:
        /// one that relays the operator's changes only, one that holds the rogue's and the
        /// unsigned ones too (and takes anything). Whatever the rogue peer's messages carry,
        /// the node's policy is what the operator's changes alone make.
        #[test]
        fn over_sync_from_any_peers_only_the_operator_s_changes_make_the_policy(
            edits in prop::collection::vec(edit_strategy(), 1..16),
            seed in any::<u64>(),
        ) {
            let keys = keys();
            let Made { ops, rogue, reference, .. } = made(edits);
            let mut peers = [ops, rogue];
            let mut node = doc(4);
            let mut theirs = [automerge::sync::State::new(), automerge::sync::State::new()];
            let mut ours = [automerge::sync::State::new(), automerge::sync::State::new()];
            let mut state = seed | 1;
            for _ in 0..64 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let p = usize::from(state % 2 == 1);
                if let Some(m) = peers[p].sync_message(&mut theirs[p]) {
                    // Refused as a whole when it carries a change the operator did not sign.
                    let _ = node.receive_sync(&mut ours[p], &m, 1 << 24, Some(&keys));
                }
                if let Some(m) = node.sync_message(&mut ours[p]) {
                    let _ = peers[p].receive_sync(&mut theirs[p], &m, 1 << 24, None);
                }
            }
            // The honest peer, to the end.
            for _ in 0..16 {
                if let Some(m) = peers[0].sync_message(&mut theirs[0]) {
                    let _ = node.receive_sync(&mut ours[0], &m, 1 << 24, Some(&keys));
                }
                if let Some(m) = node.sync_message(&mut ours[0]) {
                    let _ = peers[0].receive_sync(&mut theirs[0], &m, 1 << 24, None);
                }
            }
            let got: Policy = node.policy();
            prop_assert_eq!(got, reference.policy(), "seed {}", seed);
        }
    }
}
