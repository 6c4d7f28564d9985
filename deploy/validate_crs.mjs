// Validate custom resources read as a JSON array on stdin against the CRD schemas packaged on npm:
// PodMonitor, ServiceMonitor, PrometheusRule, AlertmanagerConfig from @kubernetes-models/prometheus-operator, ScaledObject
// from @kubernetes-models/keda (types, required fields, patterns such as durations). Unknown fields are
// caught separately by tsc (see validate_manifests.py). Prints one line per problem; exit 1 if any.
import * as operator from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import * as operatorAlpha from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1alpha1";
import * as keda from "@kubernetes-models/keda/keda.sh/v1alpha1";

const MODELS = { "monitoring.coreos.com/v1": operator, "monitoring.coreos.com/v1alpha1": operatorAlpha,
                 "keda.sh/v1alpha1": keda };

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const docs = JSON.parse(Buffer.concat(chunks).toString("utf8"));
let bad = 0;
for (const { where, doc } of docs) {
  const Model = (MODELS[doc.apiVersion] || {})[doc.kind];
  if (!Model) { console.log(`${where}: no schema for ${doc.apiVersion} ${doc.kind}`); bad++; continue; }
  try { new Model(doc).validate(); } catch (e) { console.log(`${where}: ${e.message}`); bad++; }
}
console.log(`${docs.length - bad}/${docs.length} custom resources valid`);
process.exit(bad ? 1 : 0);
