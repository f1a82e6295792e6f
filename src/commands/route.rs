//! `reshard route explain`: where a document lives and which paths its phase implies.

use serde::Serialize;

use crate::cli::RouteCommand;
use crate::commands::Ctx;
use crate::error::{Error, Result};
use crate::output;
use crate::phase::{Phase, ReadPath, WritePath};
use crate::routing::{KeyValue, Location, RoutingVersion};

#[derive(Serialize)]
struct Placed {
    version: i32,
    role: &'static str,
    sub_bucket: u32,
    vbucket: Option<u32>,
    locations: Vec<String>,
}

#[derive(Serialize)]
struct Explanation {
    collection: String,
    tenant: String,
    id: String,
    migration_id: Option<i64>,
    phase: Option<Phase>,
    placements: Vec<Placed>,
    read_path: Vec<String>,
    write_path: Vec<String>,
}

pub async fn run(ctx: &Ctx, cmd: RouteCommand) -> Result<()> {
    let RouteCommand::Explain {
        collection,
        tenant,
        id,
        version,
    } = cmd;
    let tenant_key = key_given("--tenant", &tenant)?;
    let id_key = key_given("--id", &id)?;
    let migration = ctx.store.active_migration(&collection).await?;
    let locate = |v: &RoutingVersion, role: &'static str| -> Result<Placed> {
        let located = v
            .locate(&tenant_key, &id_key)
            .map_err(|e| Error::bad_input(format!("version {}: {e}", v.version)))?;
        Ok(Placed {
            version: v.version,
            role,
            sub_bucket: located.sub_bucket,
            vbucket: located.vbucket,
            locations: located.locations.iter().map(Location::to_string).collect(),
        })
    };
    let mut placements = Vec::new();
    let (read_path, write_path);
    match (&migration, version) {
        (_, Some(n)) => {
            let v = ctx.store.version(&collection, Some(n)).await?.version;
            let placed = locate(&v, "requested")?;
            read_path = placed.locations.clone();
            write_path = placed.locations.clone();
            placements.push(placed);
        }
        (Some(m), None) => {
            let source = ctx
                .store
                .version(&collection, Some(m.from_version))
                .await?
                .version;
            let target = ctx
                .store
                .version(&collection, Some(m.to_version))
                .await?
                .version;
            let s = locate(&source, "source")?;
            let t = locate(&target, "target")?;
            let phase = m.phase();
            read_path = match phase.read_path() {
                ReadPath::Source => s.locations.clone(),
                ReadPath::TargetThenSource => [t.locations.clone(), s.locations.clone()].concat(),
                ReadPath::Target => t.locations.clone(),
            };
            write_path = match phase.write_path() {
                WritePath::Source => s.locations.clone(),
                WritePath::Held => vec!["(held by the write switch)".to_owned()],
                WritePath::Target => t.locations.clone(),
                WritePath::TargetMirroredToSource => {
                    [t.locations.clone(), s.locations.clone()].concat()
                }
            };
            placements.push(s);
            placements.push(t);
        }
        (None, None) => {
            let current = ctx.store.current_version(&collection).await?;
            let v = ctx.store.version(&collection, Some(current)).await?.version;
            let placed = locate(&v, "current")?;
            read_path = placed.locations.clone();
            write_path = placed.locations.clone();
            placements.push(placed);
        }
    }
    let explanation = Explanation {
        collection,
        tenant: tenant_key.to_string(),
        id: id_key.to_string(),
        migration_id: migration.as_ref().map(|m| m.id),
        phase: migration.as_ref().map(|m| m.phase()),
        placements,
        read_path,
        write_path,
    };
    output::emit(ctx.output, &explanation, || {
        let e = &explanation;
        let mut pairs = vec![
            ("collection", e.collection.clone()),
            ("tenant", e.tenant.clone()),
            ("id", e.id.clone()),
            (
                "phase",
                match (e.migration_id, e.phase) {
                    (Some(id), Some(p)) => format!("{p} (migration {id})"),
                    _ => "no active migration".to_owned(),
                },
            ),
        ];
        for p in &e.placements {
            pairs.push((
                p.role,
                format!(
                    "v{}: sub-bucket {}, vbucket {}, {}",
                    p.version,
                    p.sub_bucket,
                    output::or_dash(p.vbucket),
                    p.locations.join(" | ")
                ),
            ));
        }
        pairs.push(("reads", e.read_path.join(" then ")));
        pairs.push(("writes", e.write_path.join(" + ")));
        output::fields(&pairs);
    })
}

/// A key as a flag gives it: Extended JSON when it starts with `{` or `"` (as the `_id`s of
/// JSON output are written: `{"$numberLong": "7"}`, `"7"`), otherwise the prefixed form of
/// [`KeyValue::parse_cli`] (`int:7`, `oid:...`, plain text a string).
fn key_given(flag: &str, given: &str) -> Result<KeyValue> {
    if given.starts_with('{') || given.starts_with('"') {
        let value = crate::ids::parse_given(given)
            .map_err(|e| Error::bad_input(e.replacen("--id", flag, 1)))?;
        return KeyValue::from_bson(&value)
            .map_err(|e| Error::bad_input(format!("{flag} {given}: {e}")));
    }
    KeyValue::parse_cli(given).map_err(|e| Error::bad_input(format!("{flag}: {e}")))
}
