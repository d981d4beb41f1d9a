// Start the open-source Portkey gateway (@portkey-ai/gateway, this folder's lock file) for the lab:
// on 127.0.0.1, on a port the kernel picks, with one gateway config for every request, and its
// request logs appended to a file.
//
// Why a launcher: the gateway's package exports nothing (its build is one bundle,
// build/start-server.js, that creates its Hono app and serves it itself) and that entry point has
// only `--port=N` and listens on every interface: it calls @hono/node-server's public
// `serve({fetch, port})`, with no hostname. So this registers a module resolution hook (Node's
// public `module.register`, hooks.mjs) that gives that one bundle our `serve` (serve.mjs) for
// "@hono/node-server": it serves the gateway's own `fetch` through the real `serve` on 127.0.0.1,
// port 0, adding the lab's config header on a new `Request`. Nothing is patched: no prototype, no
// library internal. What serve.mjs reads from its environment is described there.
//
// Prints `portkey listening on http://127.0.0.1:PORT` once the port is bound and the log stream is
// subscribed (so no request's log entry is missed).

import { register } from "node:module";

register("./hooks.mjs", import.meta.url);
const { gatewayServed } = await import("./serve.mjs");

await import("@portkey-ai/gateway/build/start-server.js");
// The bundle's top level (which calls `serve`) has run by now. A gateway release that serves
// itself another way would listen on every interface without the lab's config: refuse loudly.
if (!gatewayServed()) {
  console.error(
    "error: the Portkey gateway did not call @hono/node-server's serve; hooks.mjs was written for " +
      "@portkey-ai/gateway 1.15.2's build/start-server.js: see labs/gateways/portkey/",
  );
  process.exit(1);
}
