// Validate prometheus-operator custom resources (PodMonitor, ServiceMonitor, PrometheusRule) read as a
// JSON array on stdin against the CRD schemas packaged in @kubernetes-models/prometheus-operator
// (types, required fields, patterns such as durations). Unknown fields are caught separately by
// tsc (see validate.sh). Prints one line per problem; exit 1 if any.
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const docs = JSON.parse(Buffer.concat(chunks).toString("utf8"));
let bad = 0;
for (const { where, doc } of docs) {
  const Model = v1[doc.kind];
  if (!Model) { console.log(`${where}: no schema for ${doc.apiVersion} ${doc.kind}`); bad++; continue; }
  try { new Model(doc).validate(); } catch (e) { console.log(`${where}: ${e.message}`); bad++; }
}
console.log(`${docs.length - bad}/${docs.length} prometheus-operator resources valid`);
process.exit(bad ? 1 : 0);
