//! What drivers, shells and tools ask about the server when they connect: `ping`,
//! `buildInfo`, `getParameter`, `getLog`, `hostInfo`, `getCmdLineOpts`, `whatsmyuri`,
//! `connectionStatus`. `mongosh` sends most of them before its first prompt.

use bson::{doc, Bson, DateTime, Document};

use super::{is_generic_argument, Command, Context, Reply};
use crate::front::error::{CommandError, ErrorCode};
use crate::front::{FEATURE_COMPATIBILITY_VERSION, MAX_BSON_OBJECT_SIZE, MONGODB_VERSION};

pub fn ping(_: &mut Context<'_>, _: &Command) -> Reply {
    Ok(Document::new())
}

/// The MongoDB version whose semantics the front follows, and reshard's own version beside it
/// (tools print `version`; a person looking at the reply sees what answered).
pub fn build_info(_: &mut Context<'_>, _: &Command) -> Reply {
    let version_array: Vec<i32> = MONGODB_VERSION
        .split('.')
        .map(|part| part.parse().unwrap_or(0))
        .chain(std::iter::once(0))
        .collect();
    Ok(doc! {
        "version": MONGODB_VERSION,
        "gitVersion": "",
        "modules": [],
        "allocator": "system",
        "javascriptEngine": "none",
        "sysInfo": "deprecated",
        "versionArray": version_array,
        "bits": 64,
        "debug": false,
        "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
        "storageEngines": [],
        "reshard": {"version": env!("CARGO_PKG_VERSION")},
    })
}

/// The parameters `getParameter` reports.
fn parameters() -> Document {
    doc! {
        "featureCompatibilityVersion": {"version": FEATURE_COMPATIBILITY_VERSION},
    }
}

/// `{getParameter: 1, name: 1}` reports the named parameters; `{getParameter: "*"}` (or
/// `{getParameter: {allParameters: true}}`) all of them. A name the front does not know is
/// refused, as MongoDB refuses it.
pub fn get_parameter(_: &mut Context<'_>, command: &Command) -> Reply {
    let known = parameters();
    let all = match command.value() {
        Bson::String(s) => s == "*",
        Bson::Document(options) => options.get_bool("allParameters") == Ok(true),
        _ => false,
    };
    if all {
        return Ok(known);
    }
    let mut reply = Document::new();
    for field in command.body.keys().skip(1) {
        if is_generic_argument(field) {
            continue;
        }
        let value = known.get(field).ok_or_else(|| {
            CommandError::new(ErrorCode::InvalidOptions, "no option found to get")
        })?;
        reply.insert(field.clone(), value.clone());
    }
    if reply.is_empty() {
        return Err(CommandError::new(
            ErrorCode::InvalidOptions,
            "no option found to get",
        ));
    }
    Ok(reply)
}

/// The front keeps no log in memory: every log MongoDB names is there, and empty.
pub fn get_log(_: &mut Context<'_>, command: &Command) -> Reply {
    const LOGS: [&str; 2] = ["global", "startupWarnings"];
    let Bson::String(name) = command.value() else {
        return Err(CommandError::new(
            ErrorCode::TypeMismatch,
            format!(
                "Argument to getLog must be of type String; found {} of type {:?}",
                command.value(),
                command.value().element_type()
            ),
        ));
    };
    if name == "*" {
        return Ok(doc! {"names": LOGS.to_vec()});
    }
    if !LOGS.contains(&name.as_str()) {
        return Err(CommandError::new(
            ErrorCode::OperationFailed,
            format!("no RamLog named: {name}"),
        ));
    }
    Ok(doc! {"totalLinesWritten": 0_i64, "log": []})
}

pub fn host_info(_: &mut Context<'_>, _: &Command) -> Reply {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(doc! {
        "system": {
            "currentTime": DateTime::now(),
            "hostname": crate::identity::hostname(),
            "cpuAddrSize": i32::try_from(usize::BITS).unwrap_or(64),
            "numCores": i32::try_from(cores).unwrap_or(i32::MAX),
            "cpuArch": std::env::consts::ARCH,
            "numaEnabled": false,
        },
        "os": {
            "type": os_type(),
            "name": std::env::consts::OS,
        },
        "extra": {},
    })
}

fn os_type() -> &'static str {
    match std::env::consts::OS {
        "linux" => "Linux",
        "macos" => "Darwin",
        "windows" => "Windows",
        _ => "Unknown",
    }
}

/// The command line (redacted where it was read) and what it set.
pub fn get_cmd_line_opts(context: &mut Context<'_>, _: &Command) -> Reply {
    let local = context.connection.local;
    Ok(doc! {
        "argv": context.settings.argv.clone(),
        "parsed": {
            "net": {"bindIp": local.ip().to_string(), "port": i32::from(local.port())},
        },
    })
}

pub fn whatsmyuri(context: &mut Context<'_>, _: &Command) -> Reply {
    Ok(doc! {"you": context.connection.peer.to_string()})
}

/// Who the connection authenticated as (no one without `--users-file`). The front has no
/// roles: an authenticated user may run every command.
pub fn connection_status(context: &mut Context<'_>, command: &Command) -> Reply {
    let mut auth_info = doc! {
        "authenticatedUsers": super::auth::authenticated_users(context.connection),
        "authenticatedUserRoles": [],
    };
    if command.body.get_bool("showPrivileges") == Ok(true) {
        auth_info.insert("authenticatedUserPrivileges", Bson::Array(Vec::new()));
    }
    Ok(doc! {"authInfo": auth_info})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::commands::tests::{answer, answer_on, connection, msg};
    use crate::front::Settings;

    #[test]
    fn ping_answers_ok() {
        assert_eq!(answer(doc! {"ping": 1, "$db": "admin"}), doc! {"ok": 1.0});
    }

    #[test]
    fn build_info_reports_the_version_whose_semantics_the_front_follows() {
        for name in ["buildInfo", "buildinfo"] {
            let reply = answer(doc! {name: 1, "$db": "admin"});
            assert_eq!(reply.get_str("version"), Ok("7.0.0"));
            assert_eq!(
                reply.get_array("versionArray").unwrap(),
                &vec![
                    Bson::Int32(7),
                    Bson::Int32(0),
                    Bson::Int32(0),
                    Bson::Int32(0)
                ]
            );
            assert_eq!(reply.get_i32("maxBsonObjectSize"), Ok(16_777_216));
            assert_eq!(reply.get_f64("ok"), Ok(1.0));
        }
    }

    #[test]
    fn get_parameter_reports_the_feature_compatibility_version_and_refuses_unknown_names() {
        let fcv = doc! {"featureCompatibilityVersion": {"version": "7.0"}, "ok": 1.0};
        assert_eq!(
            answer(
                doc! {"getParameter": 1, "featureCompatibilityVersion": 1, "$db": "admin", "lsid": {"id": 1}}
            ),
            fcv
        );
        assert_eq!(answer(doc! {"getParameter": "*", "$db": "admin"}), fcv);
        assert_eq!(
            answer(doc! {"getParameter": {"allParameters": true}, "$db": "admin"}),
            fcv
        );
        for refused in [
            doc! {"getParameter": 1, "noSuchParameter": 1, "$db": "admin"},
            doc! {"getParameter": 1, "$db": "admin"},
        ] {
            let reply = answer(refused);
            assert_eq!(reply.get_str("codeName"), Ok("InvalidOptions"), "{reply}");
            assert_eq!(reply.get_str("errmsg"), Ok("no option found to get"));
        }
    }

    #[test]
    fn get_log_has_every_log_mongodb_names_and_each_is_empty() {
        assert_eq!(
            answer(doc! {"getLog": "startupWarnings", "$db": "admin"}),
            doc! {"totalLinesWritten": 0_i64, "log": [], "ok": 1.0}
        );
        assert_eq!(
            answer(doc! {"getLog": "*", "$db": "admin"}),
            doc! {"names": ["global", "startupWarnings"], "ok": 1.0}
        );
        let reply = answer(doc! {"getLog": "nope", "$db": "admin"});
        assert_eq!(reply.get_str("errmsg"), Ok("no RamLog named: nope"));
        let reply = answer(doc! {"getLog": 1, "$db": "admin"});
        assert_eq!(reply.get_i32("code"), Ok(14), "{reply}");
    }

    #[test]
    fn the_connection_s_addresses_and_command_line_are_reported() {
        let settings = Settings {
            argv: vec!["reshard".into(), "front".into()],
            ..Settings::default()
        };
        let reply = answer_on(
            &mut connection(),
            &settings,
            msg(doc! {"getCmdLineOpts": 1, "$db": "admin"}),
        );
        assert_eq!(
            reply,
            doc! {
                "argv": ["reshard", "front"],
                "parsed": {"net": {"bindIp": "127.0.0.1", "port": 27018}},
                "ok": 1.0,
            }
        );
        assert_eq!(
            answer(doc! {"whatsmyuri": 1, "$db": "admin"}),
            doc! {"you": "127.0.0.1:50000", "ok": 1.0}
        );
    }

    #[test]
    fn host_info_and_connection_status_answer_in_mongodb_s_shape() {
        let reply = answer(doc! {"hostInfo": 1, "$db": "admin"});
        let system = reply.get_document("system").unwrap();
        assert!(system.get_i32("numCores").unwrap() >= 1);
        assert!(matches!(system.get("currentTime"), Some(Bson::DateTime(_))));
        assert!(reply.get_document("os").unwrap().get_str("type").is_ok());
        assert_eq!(
            answer(doc! {"connectionStatus": 1, "showPrivileges": true, "$db": "admin"}),
            doc! {
                "authInfo": {
                    "authenticatedUsers": [],
                    "authenticatedUserRoles": [],
                    "authenticatedUserPrivileges": [],
                },
                "ok": 1.0,
            }
        );
    }
}
