// MQTT.js over WebSocket: connect, subscribe, publish, receive; prints one JSON line per event.
// node roundtrip.js URL TOPIC PROTOCOL_VERSION [CA_FILE]
"use strict";
const fs = require("fs");
const mqtt = require("mqtt");

const [url, topic, version, caFile] = process.argv.slice(2);
const say = (event) => console.log(JSON.stringify(event));
const options = {
  protocolVersion: Number(version),
  clientId: `mqttjs-${process.pid}-${Date.now()}`,
  reconnectPeriod: 0,
  connectTimeout: 10000,
};
if (caFile) options.ca = fs.readFileSync(caFile);

const guard = setTimeout(() => {
  say({ event: "timeout" });
  process.exit(2);
}, 15000);

const client = mqtt.connect(url, options);
client.on("error", (err) => {
  say({ event: "error", message: String(err && err.message) });
  process.exit(1);
});
client.on("connect", (connack) => {
  say({ event: "connect", reasonCode: connack.reasonCode ?? connack.returnCode ?? 0 });
  client.subscribe(topic, { qos: 1 }, (err, granted) => {
    if (err) {
      say({ event: "error", message: String(err.message) });
      process.exit(1);
    }
    say({ event: "suback", qos: granted.map((g) => g.qos) });
    client.publish(topic, "hello from mqtt.js", { qos: 1 }, (perr) => {
      if (perr) {
        say({ event: "error", message: String(perr.message) });
        process.exit(1);
      }
      say({ event: "puback" });
    });
  });
});
client.on("message", (t, payload, packet) => {
  say({ event: "message", topic: t, payload: payload.toString(), qos: packet.qos });
  client.end(false, () => {
    clearTimeout(guard);
    say({ event: "end" });
  });
});
