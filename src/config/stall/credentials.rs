//! The login keys shared by `[stall_watch.probe]` and `[stall_watch.shards]`: `username`
//! with `password` or `password_env` (read into a [`Secret`]), optional `auth_source`.

use toml::Spanned;

use super::{Credentials, Secret};
use crate::config::spans::{Ctx, Recorded};

/// The login keys of `[stall_watch.probe]` or `[stall_watch.shards]` (serde cannot flatten
/// them into a table that denies unknown keys).
pub(in crate::config) struct RawCreds<'a> {
    pub(in crate::config) username: Option<&'a Spanned<String>>,
    pub(in crate::config) password: Option<&'a Spanned<String>>,
    pub(in crate::config) password_env: Option<&'a Spanned<String>>,
    pub(in crate::config) auth_source: Option<&'a Spanned<String>>,
}

/// `username` with `password` or `password_env`, optional `auth_source`.
pub(in crate::config) fn credentials<T>(
    ctx: &mut Ctx,
    c: &RawCreds<'_>,
    table: &Spanned<T>,
    prefix: &str,
) -> Result<Option<Credentials>, Recorded> {
    let key = |k: &str| format!("{prefix}.{k}");
    let Some(user) = c.username else {
        let mut bad = false;
        for (name, v) in [
            ("password", c.password),
            ("password_env", c.password_env),
            ("auth_source", c.auth_source),
        ] {
            if let Some(v) = v {
                ctx.err(v, &key(name), "has no effect without `username`".into());
                bad = true;
            }
        }
        return if bad { Err(Recorded) } else { Ok(None) };
    };
    if user.get_ref().is_empty() {
        ctx.err(user, &key("username"), "must not be empty".into());
        return Err(Recorded);
    }
    let password = password(ctx, c, table, prefix)?;
    let auth_source = match c.auth_source {
        Some(a) if a.get_ref().is_empty() => {
            ctx.err(a, &key("auth_source"), "must not be empty".into());
            return Err(Recorded);
        }
        Some(a) => a.get_ref().clone(),
        None => "admin".to_string(),
    };
    Ok(Some(Credentials {
        username: user.get_ref().clone(),
        password,
        auth_source,
    }))
}

/// `password`, or the variable `password_env` names: exactly one of them, not empty.
fn password<T>(
    ctx: &mut Ctx,
    c: &RawCreds<'_>,
    table: &Spanned<T>,
    prefix: &str,
) -> Result<Secret, Recorded> {
    let key = |k: &str| format!("{prefix}.{k}");
    let secret = match (c.password, c.password_env) {
        (Some(p), Some(_)) => {
            let msg = "set either password or password_env, not both".to_string();
            ctx.err(p, &key("password"), msg);
            return Err(Recorded);
        }
        (Some(p), None) => Secret::new(p.get_ref().clone()),
        (None, Some(var)) => match std::env::var(var.get_ref()) {
            Ok(p) if !p.is_empty() => Secret::new(p),
            Ok(_) => {
                let msg = format!("environment variable `{}` is empty", var.get_ref());
                ctx.err(var, &key("password_env"), msg);
                return Err(Recorded);
            }
            Err(_) => {
                let msg = format!("environment variable `{}` is not set", var.get_ref());
                ctx.err(var, &key("password_env"), msg);
                return Err(Recorded);
            }
        },
        (None, None) => {
            let msg = "missing; `username` needs `password` or `password_env`".to_string();
            ctx.err(table, &key("password"), msg);
            return Err(Recorded);
        }
    };
    Ok(secret)
}
