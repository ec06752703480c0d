#!/usr/bin/env bash
# Sourced by scripts/test (and usable on its own: `source scripts/services/upstreams.sh`): installs
# what the upstream tool servers of `idem proxy`'s tests need (idem-cli/tests/upstreams/), from
# the registries, and exports where it is.
#
# - A Python virtual environment with the official MCP SDK (`mcp` on PyPI, the version pinned in
#   idem-cli/tests/upstreams/requirements.txt). The HTTP tool server needs only the standard
#   library; the MCP server needs the SDK.
# - A node_modules with the official TypeScript MCP SDK (`@modelcontextprotocol/sdk`, pinned in
#   idem-cli/tests/upstreams/package.json, with zod, typescript and node's types), and the
#   TypeScript MCP server (mcp_tool.ts) compiled by its tsc beside it (node >= 18).
#
# Both go to $IDEM_UPSTREAMS_DIR (default target/upstreams of the repository, so a clean of the
# target dir removes them). Each part is installed again only when the file it comes from
# changed (a second run takes well under a second). Debian's python3-venv, nodejs and npm
# are installed with apt-get if missing.
#
# Exports:
# - IDEM_TEST_UPSTREAM_PYTHON: the venv's python (has `mcp`).
# - IDEM_TEST_UPSTREAM_TS_SERVER: the compiled TypeScript MCP server (run it with `node FILE`).

idem_upstreams_log() { echo "upstreams.sh: $*" >&2; }

idem_upstreams_main() {
  local here src dir
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  src=$here/idem-cli/tests/upstreams
  dir=${IDEM_UPSTREAMS_DIR:-$here/target/upstreams}
  mkdir -p "$dir" || return 1
  # Each part is (re)installed only when what it was installed from changed.
  if [ "$(cat "$src/requirements.txt")" != "$(cat "$dir/python.stamp" 2>/dev/null)" ] ||
    [ ! -x "$dir/venv/bin/python" ]; then
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
      idem_upstreams_log "python3 with venv missing: installing Debian's python3-venv"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >&2
    fi
    idem_upstreams_log "installing $(tr '\n' ' ' <"$src/requirements.txt")into $dir/venv"
    rm -rf "$dir/venv" "$dir/python.stamp"
    python3 -m venv "$dir/venv" || return 1
    "$dir/venv/bin/python" -m pip install -q --disable-pip-version-check \
      -r "$src/requirements.txt" >&2 || return 1
    cp "$src/requirements.txt" "$dir/python.stamp"
  fi
  if ! cmp -s "$src/package.json" "$dir/node/package.json" ||
    [ ! -d "$dir/node/node_modules/@modelcontextprotocol/sdk" ]; then
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
      idem_upstreams_log "node or npm missing: installing Debian's nodejs and npm"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >&2
    fi
    idem_upstreams_log "installing the TypeScript MCP SDK into $dir/node"
    rm -rf "$dir/node" && mkdir -p "$dir/node" || return 1
    cp "$src/package.json" "$dir/node/package.json.new" || return 1
    (cd "$dir/node" && cp package.json.new package.json &&
      npm install --silent --no-audit --no-fund >&2) || { rm -f "$dir/node/package.json"; return 1; }
  fi
  if ! cmp -s "$src/mcp_tool.ts" "$dir/node/mcp_tool.ts" ||
    ! cmp -s "$src/tsconfig.json" "$dir/node/tsconfig.json" || [ ! -f "$dir/node/mcp_tool.js" ]; then
    idem_upstreams_log "compiling mcp_tool.ts"
    rm -f "$dir/node/mcp_tool.ts" "$dir/node/mcp_tool.js"
    cp "$src/tsconfig.json" "$dir/node/" || return 1
    cp "$src/mcp_tool.ts" "$dir/node/mcp_tool.ts.new" || return 1
    (cd "$dir/node" && cp mcp_tool.ts.new mcp_tool.ts &&
      node node_modules/typescript/bin/tsc -p tsconfig.json >&2) ||
      { rm -f "$dir/node/mcp_tool.ts" "$dir/node/mcp_tool.js"; return 1; }
  fi
  export IDEM_TEST_UPSTREAM_PYTHON=$dir/venv/bin/python
  export IDEM_TEST_UPSTREAM_TS_SERVER=$dir/node/mcp_tool.js
  idem_upstreams_log "IDEM_TEST_UPSTREAM_PYTHON=$IDEM_TEST_UPSTREAM_PYTHON"
  idem_upstreams_log "IDEM_TEST_UPSTREAM_TS_SERVER=$IDEM_TEST_UPSTREAM_TS_SERVER"
}

idem_upstreams_main
