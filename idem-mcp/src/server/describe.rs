//! How the side-effecting tools are presented: the capability in `get_info`, and each tool's
//! description, `_meta` and annotations in `list_tools` ([contract §5](idem_core::contract#mcp)).

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{JsonObject, ListToolsResult, MetaObject, ServerConfig, Tool, ToolAnnotations};
use serde_json::json;

use super::{IdempotentTools, MissingKey};
use crate::key;

/// The tool `_meta` entry with the machine-readable contract (`processingWindowMs`,
/// `minClientDeadlineMs`, `keyRequired`): `"io.idem/idempotency"`.
pub const TOOL_META_KEY: &str = "io.idem/idempotency";
/// The capability advertised in `capabilities.experimental` (rmcp's `ToolsCapability` has no
/// slot for the draft's `tools.idempotency`): `"tools.idempotency"`.
pub const CAPABILITY: &str = "tools.idempotency";

impl IdempotentTools {
    /// Adds the `tools.idempotency` capability (in `capabilities.experimental`) to `info`.
    pub fn advertise(&self, mut info: ServerConfig) -> ServerConfig {
        let mut names: Vec<&String> = self.tools.keys().collect();
        names.sort();
        let mut settings = JsonObject::new();
        settings.insert("keyField".into(), json!(key::PARAMS_FIELD));
        settings.insert("metaKey".into(), json!(key::META_KEY));
        settings.insert("tools".into(), json!(names));
        info.capabilities
            .experimental
            .get_or_insert_with(Default::default)
            .insert(CAPABILITY.to_owned(), settings);
        info
    }

    /// Describes the protection of each side-effecting tool in `tools`: its description gains the
    /// processing window and the minimum client retry deadline, its `_meta` gains
    /// [`TOOL_META_KEY`], and its annotations are set honestly: `readOnlyHint: false`,
    /// `idempotentHint: true` only when every accepted call carries a key
    /// ([`MissingKey::Refuse`]), `destructiveHint` per `ToolSettings::destructive`.
    pub fn describe(&self, tools: Vec<Tool>) -> Vec<Tool> {
        tools.into_iter().map(|t| self.describe_tool(t)).collect()
    }

    fn describe_tool(&self, mut tool: Tool) -> Tool {
        let Some(settings) = self.tools.get(tool.name.as_ref()) else {
            return tool;
        };
        let contract = self.contract_of(settings);
        let window = contract.processing_window().as_millis() as u64;
        let deadline = contract.min_client_deadline().as_millis() as u64;
        let max_wait = self.executor.max_wait().as_millis() as u64;
        let without = match settings.missing_key {
            MissingKey::Refuse => "a call without a key is refused",
            MissingKey::RunUnprotected => {
                "a call without a key runs unprotected and a retry of it may repeat the effect"
            }
        };
        let note = format!(
            "Side-effecting. Send an idempotency key made from your durable workflow step \
             (params.idempotencyKey, or params._meta[\"{meta}\"]) and reuse it on every retry: \
             with a key the call runs once and a repeat returns the first result; {without}. \
             Processing window: {window} ms; minimum client retry deadline: {deadline} ms — an \
             attempt shorter than that is cut off while the tool is still working. A retry sent \
             while the first call runs may wait for its result: params._meta[\"{wait}\"] \
             (seconds), up to {max_wait} ms.",
            meta = key::META_KEY,
            wait = crate::wait::WAIT_META_KEY,
        );
        tool.description = Some(match tool.description.take() {
            Some(d) if !d.is_empty() => format!("{d}\n\n{note}").into(),
            _ => note.into(),
        });
        let mut annotations = tool.annotations.take().unwrap_or_default();
        annotations = with_hints(
            annotations,
            settings.missing_key == MissingKey::Refuse,
            settings.destructive,
        );
        tool.annotations = Some(annotations);
        let meta = tool.meta.get_or_insert_with(MetaObject::default);
        meta.0.insert(
            TOOL_META_KEY.to_owned(),
            json!({
                "processingWindowMs": window,
                "minClientDeadlineMs": deadline,
                "maxWaitMs": max_wait,
                "keyRequired": settings.missing_key == MissingKey::Refuse,
            }),
        );
        tool
    }

    /// The `list_tools` answer of a server whose tools are `router`'s, each
    /// [described](Self::describe).
    pub fn list_routed<S: Send + Sync + 'static>(&self, router: &ToolRouter<S>) -> ListToolsResult {
        ListToolsResult::with_all_items(self.describe(router.list_all()))
    }
}

fn with_hints(
    mut annotations: ToolAnnotations,
    idempotent: bool,
    destructive: Option<bool>,
) -> ToolAnnotations {
    annotations.read_only_hint = Some(false);
    annotations.idempotent_hint = Some(idempotent);
    if destructive.is_some() {
        annotations.destructive_hint = destructive;
    }
    annotations
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_honest() {
        let a = with_hints(ToolAnnotations::default(), true, Some(false));
        assert_eq!(
            (a.read_only_hint, a.idempotent_hint, a.destructive_hint),
            (Some(false), Some(true), Some(false))
        );
        let a = with_hints(ToolAnnotations::default(), false, None);
        assert_eq!((a.idempotent_hint, a.destructive_hint), (Some(false), None));
    }
}
