// A misbehaving peer for the client's failure paths (the real sidecar never does these):
// it answers the handshake, then
//   test:hang       never answers (a `$/cancelRequest` for it is reported as test:cancelled)
//   test:garbage    writes lines that are not JSON-RPC, then answers
//   test:exit       exits at once with code 3
//   sidecar:shutdown  answers and exits 0, unless FAKE_STUBBORN=1: then it ignores the
//                   shutdown, the end of stdin and SIGTERM (only SIGKILL ends it)
// FAKE_PROTOCOL_VERSION sets the version the handshake answers with.
import { createInterface } from "node:readline";

const stubborn = process.env.FAKE_STUBBORN === "1";
const version = Number(process.env.FAKE_PROTOCOL_VERSION ?? "1");
const write = (message) => process.stdout.write(JSON.stringify(message) + "\n");

if (stubborn) process.on("SIGTERM", () => undefined);
const keepAlive = stubborn ? setInterval(() => undefined, 1000) : null;

const lines = createInterface({ input: process.stdin });
lines.on("line", (line) => {
  const message = JSON.parse(line);
  const { id, method, params } = message;
  switch (method) {
    case "sidecar:initialize":
      write({
        jsonrpc: "2.0",
        id,
        result: {
          protocolVersion: version,
          serverInfo: { name: "fake", version: "0" },
          capabilities: { methods: [], implemented: [], notifications: [], maxLineBytes: 1024 },
          dataDir: "/nowhere",
        },
      });
      break;
    case "test:hang":
      break;
    case "$/cancelRequest":
      write({ jsonrpc: "2.0", method: "test:cancelled", params });
      break;
    case "test:garbage":
      process.stdout.write("this is not json\n");
      process.stdout.write('{"jsonrpc": "1.0", "id": 999}\n');
      process.stdout.write("[]\n");
      process.stdout.write('{"jsonrpc":"2.0","method":"chat:stream","params":{"no":"ids"}}\n');
      process.stdout.write('{"jsonrpc":"2.0","id":12345,"result":"nobody asked"}\n');
      write({ jsonrpc: "2.0", id, result: { fine: true } });
      break;
    case "test:exit":
      process.exit(3);
      break;
    case "sidecar:shutdown":
      if (stubborn) break;
      write({ jsonrpc: "2.0", id, result: { success: true } });
      process.exit(0);
      break;
    default:
      write({ jsonrpc: "2.0", id, error: { code: -32601, message: `fake: no method ${method}` } });
  }
});
lines.on("close", () => {
  if (!stubborn) process.exit(0);
  void keepAlive;
});
