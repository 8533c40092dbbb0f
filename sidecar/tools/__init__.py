"""sidecar.tools: the tools a model can call in direct mode.

    base.py          Tool, ToolContext, ToolOutput, ToolError
    registry.py      ToolRegistry: one request's tools; checking and running a call
    service.py       ToolService: tool settings, per-request assembly (seed 000 section 3)
    spill.py         large outputs (> 32 KiB) to tool_outputs/<session tag>-<toolCallId>.txt
    workspace.py     read/write/list/run confined to the session's workspace dir
    local.py         built-in local tools, read_tool_output, get_session_capabilities
    conversation.py  search_conversations over the message store
    web.py           web_search over a pluggable HTTP backend (SearXNG JSON)
    skills.py        skill_list / skill_load (folders holding a SKILL.md)
    mcp.py           McpManager: MCP servers as tool sources
    mcp_config.py    McpServerConfig (stored, secrets kept out of reprs), tool names
    mcp_supervisor.py  ServerSupervisor: one server kept connected in the background
    mcp_client.py    McpSession: our MCP client (initialize, tools) on the JSON-RPC peer
    mcp_transport.py the stdio (own process group) and streamable HTTP links
    mcp_http.py      HttpChannel: streamable HTTP as the byte streams the peer sits on

The approval flow lives in sidecar/engine/approvals.py; the step loop in
sidecar/engine/generation.py.
"""
