//! `reshard version`: routing versions of a collection.

use crate::cli::VersionCommand;
use crate::commands::Ctx;
use crate::error::{Error, Result};
use crate::output;
use crate::routing::{Layout, RoutingVersion, ValidationContext};
use crate::spec;
use crate::store::versions::StoredVersion;

pub async fn run(ctx: &Ctx, cmd: VersionCommand) -> Result<()> {
    match cmd {
        VersionCommand::Create {
            collection,
            file,
            dry_run,
        } => {
            let shown = file.display().to_string();
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Error::bad_input(format!("{shown}: cannot read: {e}")))?;
            let version = spec::parse_version_spec(&shown, &text, &collection)
                .map_err(|errors| spec_errors(&errors))?;
            let known = ctx.store.version_context(&collection).await?;
            let validation = ValidationContext {
                registered_shards: &known.registered_shards,
                previous_virtual_buckets: known.previous_virtual_buckets,
            };
            spec::check_version_spec(&shown, &text, &version, &validation)
                .map_err(|errors| spec_errors(&errors))?;
            // MongoDB limits a namespace (database and collection) as a whole: check each
            // collection of the version with its shard's database.
            let databases: std::collections::BTreeMap<String, String> = ctx
                .store
                .shards()
                .await?
                .into_iter()
                .map(|s| (s.name, s.database))
                .collect();
            for shard in version.shards() {
                let name = version
                    .collections
                    .get(&shard)
                    .unwrap_or(&version.collection);
                if let Some(database) = databases.get(&shard) {
                    crate::names::collection(name, Some(database)).map_err(|rule| {
                        Error::bad_input(format!("{shown}: shard {shard}: {rule}"))
                    })?;
                }
            }
            if dry_run {
                return output::emit_change(
                    ctx.output,
                    true,
                    &version,
                    || {},
                    || {
                        println!("{shown} is valid");
                        describe(&version);
                        format!("store it as {}'s next version", version.collection)
                    },
                );
            }
            let stored = ctx
                .store
                .insert_version(&version, &text, &ctx.actor)
                .await?;
            output::emit(ctx.output, &stored, || {
                println!(
                    "created {} version {}",
                    stored.version.collection, stored.version.version
                );
            })
        }
        VersionCommand::List { collection } => {
            let versions = ctx.store.versions(collection.as_deref()).await?;
            output::emit(ctx.output, &versions, || {
                output::table(
                    &[
                        "collection",
                        "version",
                        "layout",
                        "V",
                        "shards",
                        "created",
                        "by",
                    ],
                    versions.iter().map(|v| {
                        [
                            v.version.collection.clone(),
                            v.version.version.to_string(),
                            v.version.layout().kind().to_owned(),
                            output::or_dash(v.version.virtual_buckets()),
                            v.version
                                .shards()
                                .into_iter()
                                .collect::<Vec<_>>()
                                .join(", "),
                            v.created_at.to_rfc3339(),
                            v.created_by.clone(),
                        ]
                    }),
                )
            })
        }
        VersionCommand::Show {
            collection,
            version,
        } => {
            let stored: StoredVersion = ctx.store.version(&collection, version).await?;
            output::emit(ctx.output, &stored, || {
                describe(&stored.version);
                println!(
                    "created      {} by {}",
                    stored.created_at.to_rfc3339(),
                    stored.created_by
                );
            })
        }
    }
}

fn spec_errors(errors: &[spec::SpecError]) -> Error {
    Error::bad_input(
        errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

fn describe(v: &RoutingVersion) {
    let mut pairs = vec![
        ("collection", v.collection.clone()),
        ("version", v.version.to_string()),
        ("layout", v.layout().kind().to_owned()),
        ("tenant key", v.tenant_key.clone()),
        ("id field", v.id_field.clone()),
    ];
    match v.layout() {
        Layout::Hashed {
            virtual_buckets,
            default_buckets,
            tenant_buckets,
            routing_field,
            ..
        } => {
            pairs.push(("vbuckets", virtual_buckets.to_string()));
            pairs.push(("buckets", format!("{default_buckets} by default")));
            for t in tenant_buckets {
                pairs.push(("", format!("{} for tenant {}", t.buckets, t.tenant)));
            }
            pairs.push(("routing field", output::or_dash(routing_field.as_ref())));
        }
        Layout::Fanout { shards } => pairs.push(("shards", shards.join(", "))),
        Layout::TenantTable {
            tenants,
            default_shard,
        } => {
            pairs.push(("tenants", tenants.len().to_string()));
            pairs.push(("default shard", output::or_dash(default_shard.as_ref())));
        }
    }
    output::fields(&pairs);
    if let Layout::Hashed { placement, .. } = v.layout() {
        output::table(
            &["vbuckets", "shard", "collection"],
            placement.iter().map(|r| {
                [
                    format!("[{}, {})", r.start, r.end),
                    r.shard.clone(),
                    v.location_on(&r.shard).collection,
                ]
            }),
        );
    }
}
