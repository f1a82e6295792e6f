//! What a scan of a source location reads: the scope ([`routing::scope_at`], widened when
//! documents that stay must be stamped) and its MongoDB filter. Pure; shared by the backfill's
//! planner, reconciliation and the driver's preparation.

use mongodb::bson::{doc, Bson, Document};

use crate::routing::{self, KeyValue, Location, MoveScope, RoutingVersion};

/// The scan scope at `location`: [`routing::scope_at`], widened to everything when staying
/// documents need the target's routing field stamped.
pub fn location_scope(
    from: &RoutingVersion,
    to: &RoutingVersion,
    location: &Location,
) -> MoveScope {
    let scope = routing::scope_at(from, to, location);
    match (&scope, routing::diff(from, to).stamp_routing_field) {
        (MoveScope::Everything { .. }, _) | (_, None) => scope,
        (_, Some(field)) => MoveScope::Everything {
            reason: format!(
                "documents that stay at {location} get the routing field {field:?} stamped"
            ),
        },
    }
}

/// The MongoDB filter of a scope (`None`: nothing to scan).
pub fn scope_filter(tenant_key: &str, scope: &MoveScope) -> Option<Document> {
    match scope {
        MoveScope::Nothing => None,
        MoveScope::Everything { .. } => Some(Document::new()),
        MoveScope::Tenants(tenants) => Some(tenant_filter(tenant_key, tenants)),
    }
}

pub fn tenant_filter(tenant_key: &str, tenants: &[KeyValue]) -> Document {
    let values: Vec<Bson> = tenants.iter().map(KeyValue::to_bson).collect();
    doc! { tenant_key: { "$in": values } }
}

/// Whether a scope is the whole location (for reports).
pub fn scope_name(scope: &MoveScope) -> &'static str {
    match scope {
        MoveScope::Nothing => "nothing",
        MoveScope::Tenants(_) => "tenants",
        MoveScope::Everything { .. } => "everything",
    }
}
