//! Authentication and authorization by JavaScript functions.
//!
//! The core calls its [`Authenticator`] and [`Authorizer`] synchronously, in the middle of an
//! input. A JS hook that throws, or answers something that is not an answer, must not unwind
//! through the core: the failure counts as a refusal, and the error is queued as a
//! `{ type: "hookError", hook, error }` output for the shell to log.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::Function;
use meridian_core::broker::{
    AuthOutcome, AuthRequest, Authenticator, Authorizer, ClientRef, FilterAccess,
};
use meridian_core::codec::ReasonCode;
use meridian_core::topic::TopicFilter;
use wasm_bindgen::{JsCast, JsValue};

use crate::js::{self, Fields, Obj};

/// Errors thrown by hooks, waiting to be handed to the shell.
pub(crate) type HookErrors = Rc<RefCell<Vec<(&'static str, JsValue)>>>;

/// The hook functions found in the `hooks` argument of `new Broker`.
pub(crate) struct Hooks {
    pub authenticate: Option<Function>,
    pub may_publish: Option<Function>,
    pub may_subscribe: Option<Function>,
    pub may_receive: Option<Function>,
}

impl Hooks {
    pub(crate) fn from_js(value: &JsValue) -> Result<Self, JsValue> {
        let mut f = Fields::optional(value, "hooks")?;
        let mut function = |key: &'static str| -> Result<Option<Function>, JsValue> {
            let path = f.path_of(key);
            match f.get(key)? {
                None => Ok(None),
                Some(v) if v.is_function() => Ok(Some(v.into())),
                Some(v) => Err(js::type_error(&format!(
                    "{path}: expected a function, got {}",
                    js::describe(&v)
                ))),
            }
        };
        let hooks = Self {
            authenticate: function("authenticate")?,
            may_publish: function("mayPublish")?,
            may_subscribe: function("maySubscribe")?,
            may_receive: function("mayReceive")?,
        };
        f.finish()?;
        Ok(hooks)
    }
}

/// Calls a JS authenticator: `authenticate(request) -> AuthResult | "pending"`.
pub(crate) struct JsAuthenticator {
    pub function: Function,
    pub errors: HookErrors,
}

impl Authenticator for JsAuthenticator {
    fn authenticate(&mut self, r: &AuthRequest<'_>) -> AuthOutcome {
        let req = Obj::new();
        req.set("conn", js::num(r.conn.0))
            .set("clientId", r.client_id)
            .opt("username", r.username)
            .opt("password", r.password.map(js::u8array))
            .opt("method", r.method)
            .opt("data", r.data.map(js::u8array))
            .opt("tlsIdentity", r.tls_identity)
            .opt("remoteAddr", r.remote_addr)
            .set("continuation", r.continuation)
            .set("reauthentication", r.reauthentication);
        let answer = self
            .function
            .call1(&JsValue::UNDEFINED, &req.into_js())
            .and_then(|v| auth_outcome(&v, true));
        answer.unwrap_or_else(|error| {
            self.errors.borrow_mut().push(("authenticate", error));
            AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED)
        })
    }
}

/// An authenticator's answer: `true` / `{ allow: true, username? }`, `false` /
/// `{ deny: reasonCode }`, `{ continue: Uint8Array }`, or (if `pending_ok`) `"pending"`.
pub(crate) fn auth_outcome(v: &JsValue, pending_ok: bool) -> Result<AuthOutcome, JsValue> {
    if let Some(b) = v.as_bool() {
        return Ok(if b {
            AuthOutcome::Allow { username: None }
        } else {
            AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED)
        });
    }
    if pending_ok && v.as_string().as_deref() == Some("pending") {
        return Ok(AuthOutcome::Pending);
    }
    if v.has_type::<js_sys::Promise>() {
        return Err(js::type_error(
            "authenticate returned a Promise: return \"pending\" and call \
             broker.authDecision(conn, result, nowMs) when it settles",
        ));
    }
    let mut f = Fields::new(v, "auth result")?;
    let allow = f.bool("allow")?;
    let username = f.string("username")?;
    let deny = f.u8("deny")?;
    let cont = f.bytes("continue")?;
    f.finish()?;
    match (allow, deny, cont) {
        (Some(true), None, None) => Ok(AuthOutcome::Allow { username }),
        (Some(false) | None, Some(code), None) if code >= 0x80 => {
            Ok(AuthOutcome::Deny(ReasonCode(code)))
        }
        (Some(false), None, None) => Ok(AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED)),
        (None, None, Some(data)) => Ok(AuthOutcome::Continue(data)),
        _ => Err(js::type_error(
            "auth result: expected true, false, { allow: true, username? }, \
             { deny: reasonCode >= 0x80 }, { continue: Uint8Array } or \"pending\"",
        )),
    }
}

/// Calls `mayPublish(client, topic)`, `maySubscribe(client, filter)` and, for subscriptions
/// `maySubscribe` answered `"filtered"`, `mayReceive(client, topic)` per message; a missing
/// hook allows.
pub(crate) struct JsAuthorizer {
    pub may_publish: Option<Function>,
    pub may_subscribe: Option<Function>,
    pub may_receive: Option<Function>,
    pub errors: HookErrors,
}

fn client_obj(c: &ClientRef<'_>) -> JsValue {
    let o = Obj::new();
    o.set("clientId", c.client_id).set(
        "username",
        c.username.map_or(JsValue::NULL, JsValue::from_str),
    );
    o.into_js()
}

impl JsAuthorizer {
    fn ask(&self, hook: &'static str, f: &Function, client: &ClientRef<'_>, what: &str) -> bool {
        self.call(hook, f, client, what, |v| v.as_bool(), "a boolean")
            .unwrap_or(false)
    }

    /// Call a hook and read its answer; a throw or an answer `read` refuses is queued as a
    /// hook error, and gives `None`.
    fn call<T>(
        &self,
        hook: &'static str,
        f: &Function,
        client: &ClientRef<'_>,
        what: &str,
        read: impl FnOnce(&JsValue) -> Option<T>,
        expected: &str,
    ) -> Option<T> {
        let answer = f
            .call2(&JsValue::UNDEFINED, &client_obj(client), &what.into())
            .and_then(|v| {
                read(&v).ok_or_else(|| {
                    js::type_error(&format!(
                        "{hook} must return {expected}, got {}",
                        js::describe(&v)
                    ))
                })
            });
        answer
            .map_err(|error| self.errors.borrow_mut().push((hook, error)))
            .ok()
    }
}

impl Authorizer for JsAuthorizer {
    fn may_publish(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        self.may_publish
            .as_ref()
            .is_none_or(|f| self.ask("mayPublish", f, client, topic))
    }

    fn may_subscribe(&self, client: &ClientRef<'_>, filter: &TopicFilter) -> FilterAccess {
        let Some(f) = &self.may_subscribe else {
            return FilterAccess::Allowed;
        };
        let filtered_ok = self.may_receive.is_some();
        let read = |v: &JsValue| match (v.as_bool(), v.as_string().as_deref()) {
            (Some(true), _) => Some(FilterAccess::Allowed),
            (Some(false), _) => Some(FilterAccess::Denied),
            (_, Some("filtered")) if filtered_ok => Some(FilterAccess::Filtered),
            _ => None,
        };
        let expected = if filtered_ok {
            "a boolean or \"filtered\""
        } else {
            "a boolean (\"filtered\" needs a mayReceive hook)"
        };
        self.call("maySubscribe", f, client, filter.as_str(), read, expected)
            .unwrap_or(FilterAccess::Denied)
    }

    fn may_receive(&self, client: &ClientRef<'_>, topic: &str) -> bool {
        self.may_receive
            .as_ref()
            .is_none_or(|f| self.ask("mayReceive", f, client, topic))
    }
}
