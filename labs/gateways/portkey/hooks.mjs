// Module resolution hook (Node's `module.register`, loaded by launch.mjs): the Portkey gateway's
// bundle imports `serve` from "@hono/node-server"; that one import resolves to serve.mjs instead.
// Every other importer, serve.mjs included, gets the real package. Written for the versions this
// folder's lock file pins, @portkey-ai/gateway 1.15.2 (whose build/start-server.js does
// `import { serve } from "@hono/node-server"` and calls `serve({ fetch: app.fetch, port })`) and
// @hono/node-server 1.13.5; launch.mjs refuses to go on if the bundle never called our `serve`, and
// tests/test_gateway_portkey.py checks that the config header reaches the gateway.

const GATEWAY_BUNDLE = "/node_modules/@portkey-ai/gateway/build/start-server.js";
const LOOPBACK_SERVE = new URL("./serve.mjs", import.meta.url).href;

export async function resolve(specifier, context, nextResolve) {
  if (specifier === "@hono/node-server" && context.parentURL?.endsWith(GATEWAY_BUNDLE)) {
    return { url: LOOPBACK_SERVE, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}
