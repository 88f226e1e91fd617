// cella's MCP server driven by the official TypeScript SDK, over both
// transports: `cella mcp` (stdio) and the daemon's /mcp (streamable HTTP).
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const URL_ = process.env.CELLA_MCP_URL;   // the daemon, e.g. http://127.0.0.1:1234
const KEY = process.env.CELLA_MCP_KEY;
const BIN = process.env.CELLA_MCP_BIN;     // bin/cella
if (!URL_ || !KEY || !BIN) throw new Error('run through compat/mcp/run.sh');

const transports = {
  stdio: () => new StdioClientTransport({
    command: BIN, args: ['mcp'],
    env: { ...process.env, CELLA_URL: URL_, CELLA_API_KEY: KEY },
  }),
  'streamable HTTP': () => new StreamableHTTPClientTransport(new URL('/mcp', URL_), {
    requestInit: { headers: { 'X-API-Key': KEY } },
  }),
};

function structured(res) {
  assert.ok(!res.isError, `tool error: ${JSON.stringify(res.content)}`);
  return res.structuredContent;
}

for (const [name, make] of Object.entries(transports)) {
  describe(`MCP over ${name}`, { timeout: 120_000 }, () => {
    test('lists the sandbox tools with their policy', async () => {
      const client = new Client({ name: 'cella-compat', version: '1.0.0' });
      await client.connect(make());
      try {
        const { tools } = await client.listTools();
        const names = tools.map((t) => t.name).sort();
        assert.deepEqual(names, ['sandbox_create', 'sandbox_exec', 'sandbox_expose_port', 'sandbox_kill',
          'sandbox_list', 'sandbox_list_files', 'sandbox_read_file', 'sandbox_run_code', 'sandbox_write_file']);
        const exec = tools.find((t) => t.name === 'sandbox_exec');
        assert.match(exec.description, /Network egress: none: no egress is allowed/);
        assert.ok(exec.inputSchema.properties.command, 'sandbox_exec takes a command');
      } finally {
        await client.close();
      }
    });

    test('create, exec, files, expose, kill', async () => {
      const client = new Client({ name: 'cella-compat', version: '1.0.0' });
      await client.connect(make());
      let id;
      try {
        ({ sandbox_id: id } = structured(await client.callTool({ name: 'sandbox_create', arguments: { env: { GREETING: 'hi' } } })));
        assert.match(id, /^[a-z0-9]+$/);
        const run = structured(await client.callTool({ name: 'sandbox_exec', arguments: { sandbox_id: id, command: 'echo $GREETING; exit 4' } }));
        assert.equal(run.exit_code, 4);
        assert.equal(run.stdout, 'hi\n');
        assert.deepEqual(run.sandbox_events, []);
        structured(await client.callTool({ name: 'sandbox_write_file', arguments: { sandbox_id: id, path: 'notes/a.txt', content: 'from node' } }));
        const read = structured(await client.callTool({ name: 'sandbox_read_file', arguments: { sandbox_id: id, path: '/home/user/notes/a.txt' } }));
        assert.equal(read.content, 'from node');
        const list = structured(await client.callTool({ name: 'sandbox_list_files', arguments: { sandbox_id: id, path: '/home/user/notes' } }));
        assert.deepEqual(list.entries.map((e) => [e.name, e.type]), [['a.txt', 'file']]);
        const port = structured(await client.callTool({ name: 'sandbox_expose_port', arguments: { sandbox_id: id, port: 8080 } }));
        assert.ok(port.url.startsWith(`http://8080-${id}.`), port.url);
        const listed = structured(await client.callTool({ name: 'sandbox_list', arguments: {} }));
        assert.ok(listed.sandboxes.some((s) => s.sandbox_id === id));
        const bad = await client.callTool({ name: 'sandbox_exec', arguments: { sandbox_id: 'nosuchsandbox', command: 'true' } });
        assert.ok(bad.isError, 'an unknown sandbox is a tool error');
        assert.match(JSON.stringify(bad.content), /not found/);
      } finally {
        if (id) await client.callTool({ name: 'sandbox_kill', arguments: { sandbox_id: id } });
        await client.close();
      }
    });
  });
}

test('stdio: the call budget is enforced and named', { timeout: 60_000 }, async () => {
  const client = new Client({ name: 'cella-compat', version: '1.0.0' });
  await client.connect(new StdioClientTransport({
    command: BIN, args: ['mcp', '--max-calls', '1'],
    env: { ...process.env, CELLA_URL: URL_, CELLA_API_KEY: KEY },
  }));
  try {
    structured(await client.callTool({ name: 'sandbox_list', arguments: {} }));
    const over = await client.callTool({ name: 'sandbox_list', arguments: {} });
    assert.ok(over.isError);
    assert.match(JSON.stringify(over.content), /budget.*max_calls/);
  } finally {
    await client.close();
  }
});
