// A foreign gRPC client for ragguard's tests: @grpc/grpc-js, no generated code.
//
// Usage: node client.js '<json spec>'
//   spec: {"target": "127.0.0.1:port", "method": "/pkg.Svc/Method", "request": "<base64>",
//          "metadata": {"key": "value"}, "deadlineMs": 5000, "serviceConfig": {...}}
// Makes one unary call with bytes in and bytes out (the service config may carry a retry
// policy) and prints one JSON line: {"code", "details", "trailers", "response"}.
'use strict';

const grpc = require('@grpc/grpc-js');

const spec = JSON.parse(process.argv[2]);
const options = {};
if (spec.serviceConfig) {
  options['grpc.service_config'] = JSON.stringify(spec.serviceConfig);
}
const client = new grpc.Client(spec.target, grpc.credentials.createInsecure(), options);
const metadata = new grpc.Metadata();
for (const [key, value] of Object.entries(spec.metadata || {})) {
  metadata.set(key, value);
}
const identity = (buffer) => buffer;
const callOptions = { deadline: Date.now() + (spec.deadlineMs || 10000) };

function report(code, details, trailers, response) {
  const flat = {};
  for (const [key, values] of Object.entries(trailers ? trailers.getMap() : {})) {
    flat[key] = Buffer.isBuffer(values) ? values.toString('base64') : String(values);
  }
  process.stdout.write(JSON.stringify({ code, details, trailers: flat, response }) + '\n');
  client.close();
}

client.makeUnaryRequest(
  spec.method,
  identity,
  identity,
  Buffer.from(spec.request || '', 'base64'),
  metadata,
  callOptions,
  (err, response) => {
    if (err) {
      report(err.code, err.details, err.metadata, null);
    } else {
      report(0, '', null, response.toString('base64'));
    }
  },
);
