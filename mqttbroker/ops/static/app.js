// The mqttbroker dashboard: plain JavaScript, no build step. It reads /api/v1 every two
// seconds; the live topic viewer subscribes through the broker's WebSocket listener (MQTT.js).
"use strict";

const POLL_MS = 2000;
const CSRF = { "X-MQTTBroker-CSRF": "1" };
let current = "overview";
let chart = null;
let overview = null;
let live = null;

function $(id) { return document.getElementById(id); }

function status(text) { $("status").textContent = text || ""; }

async function api(path, options = {}) {
  const headers = Object.assign({}, CSRF, options.headers || {});
  const token = sessionStorage.getItem("mqttbroker-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401 && (response.headers.get("WWW-Authenticate") || "").startsWith("Bearer")) {
    $("login").hidden = false;
    throw new Error("sign in with the admin token");
  }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function age(seconds) {
  if (!seconds) return "–";
  if (seconds < 60) return seconds.toFixed(1) + " s";
  if (seconds < 3600) return (seconds / 60).toFixed(1) + " min";
  return (seconds / 3600).toFixed(1) + " h";
}

function when(unix) { return unix ? new Date(unix * 1000).toLocaleString() : "–"; }

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function button(row, label, action) {
  const td = document.createElement("td");
  const b = document.createElement("button");
  b.textContent = label;
  b.className = "danger";
  b.addEventListener("click", async () => {
    b.disabled = true;
    try { await action(); status(""); } catch (e) { status(e.message); }
    refresh();
  });
  td.appendChild(b);
  row.appendChild(td);
}

function fill(table, items, render) {
  const body = $(table).tBodies[0];
  const rows = items.map((item) => {
    const tr = document.createElement("tr");
    render(tr, item);
    return tr;
  });
  body.replaceChildren(...rows);
}

// -- overview --------------------------------------------------------------------------------

function rates(history) {
  const t = [], received = [], delivered = [];
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i];
    const dt = b.t - a.t;
    if (dt <= 0) continue;
    t.push(b.t);
    received.push((b.received - a.received) / dt);
    delivered.push((b.delivered - a.delivered) / dt);
  }
  return [t, received, delivered];
}

function drawChart(history) {
  const data = rates(history);
  const element = $("rate-chart");
  const width = Math.max(280, element.clientWidth || 600);
  if (chart === null) {
    chart = new uPlot({
      width, height: 220,
      // The two lines often coincide (one subscriber per message): received is a wide, pale
      // band with a fill under it, delivered a thin dashed line on top, so both stay visible.
      series: [
        {},
        { label: "received", stroke: "rgba(37, 99, 235, 0.45)", width: 6, fill: "rgba(37, 99, 235, 0.08)" },
        { label: "delivered", stroke: "#15803d", width: 2, dash: [8, 5] },
      ],
      axes: [{}, { size: 50 }],
    }, data, element);
    window.addEventListener("resize", () => chart.setSize({ width: Math.max(280, element.clientWidth), height: 220 }));
  } else {
    chart.setData(data);
  }
  element.dataset.points = String(data[0].length);
  const last = data[1].length ? data[1][data[1].length - 1] : 0;
  element.dataset.lastReceivedRate = last.toFixed(2);
}

function commitLatency(history) {
  if (history.length < 2) return "–";
  const a = history[Math.max(0, history.length - 16)], b = history[history.length - 1];
  const commits = b.commits - a.commits;
  if (!commits) return "idle";
  return ((b.commit_seconds - a.commit_seconds) / commits * 1000).toFixed(2) + " ms";
}

async function showOverview() {
  const o = overview = await api("/api/v1/overview");
  $("version").textContent = o.version;
  $("m-connections").textContent = o.connections;
  $("m-sessions").textContent = o.sessions_online + " / " + o.sessions_offline;
  $("m-subscriptions").textContent = o.subscriptions;
  $("m-retained").textContent = o.retained;
  $("m-queued").textContent = o.queued;
  $("m-oldest").textContent = age(o.oldest_queued_age);
  $("m-dropped").textContent = o.messages_dropped;
  $("m-commit").textContent = commitLatency(o.history);
  $("stuck-list").textContent = o.stuck_sessions.length ? o.stuck_sessions.join(", ") : "none";
  drawChart(o.history);
}

// -- tables ----------------------------------------------------------------------------------

async function showClients() {
  const prefix = encodeURIComponent($("client-search").value);
  const page = await api("/api/v1/clients?limit=200&client_id=" + prefix);
  fill("clients-table", page.items, (tr, c) => {
    if (c.stuck) tr.className = "stuck";
    tr.dataset.clientId = c.client_id;
    cell(tr, c.client_id); cell(tr, c.protocol); cell(tr, c.address); cell(tr, c.user);
    cell(tr, c.listener); cell(tr, when(c.connected_since));
    cell(tr, c.messages_received); cell(tr, c.messages_sent);
    cell(tr, c.bytes_received, "bytes-in"); cell(tr, c.bytes_sent, "bytes-out");
    cell(tr, c.inflight); cell(tr, c.queued); cell(tr, age(c.oldest_queued_age));
    button(tr, "Kick", () => api("/api/v1/clients/" + encodeURIComponent(c.client_id) + "/kick", { method: "POST" }));
  });
}

async function showSessions() {
  // The sessions with a backlog, the oldest first, then the others.
  const [waiting, all] = await Promise.all([
    api("/api/v1/sessions?limit=200&sort=oldest_queued_age"), api("/api/v1/sessions?limit=200"),
  ]);
  const listed = new Set(waiting.items.map((s) => s.client_id));
  const rest = all.items.filter((s) => !listed.has(s.client_id));
  fill("sessions-table", waiting.items.concat(rest).slice(0, 200), (tr, s) => {
    if (s.stuck) tr.className = "stuck";
    tr.dataset.clientId = s.client_id;
    cell(tr, s.client_id); cell(tr, s.online ? "online" : "offline"); cell(tr, when(s.expires_at));
    cell(tr, s.queued); cell(tr, s.inflight); cell(tr, age(s.oldest_queued_age)); cell(tr, s.dropped);
    cell(tr, s.subscriptions.map((x) => x.filter).join(" "));
    button(tr, "Delete", () => api("/api/v1/sessions/" + encodeURIComponent(s.client_id), { method: "DELETE" }));
  });
}

async function showSubscriptions() {
  const filter = encodeURIComponent($("sub-filter").value || "#");
  const [subs, shared] = await Promise.all([
    api("/api/v1/subscriptions?limit=500&filter=" + filter), api("/api/v1/shared?limit=500&filter=" + filter),
  ]);
  fill("subs-table", subs.items, (tr, s) => {
    cell(tr, s.client_id); cell(tr, s.filter); cell(tr, s.qos); cell(tr, s.share_group);
  });
  const rows = [];
  for (const g of shared.items) for (const m of g.members) rows.push([g, m]);
  fill("shared-table", rows, (tr, [g, m]) => {
    if (m.stuck) tr.className = "stuck";
    cell(tr, g.filter); cell(tr, m.client_id); cell(tr, m.online ? "online" : "offline");
    cell(tr, m.queued); cell(tr, m.inflight); cell(tr, age(m.oldest_queued_age));
  });
}

async function showRetained() {
  const filter = encodeURIComponent($("retained-filter").value || "#");
  const page = await api("/api/v1/retained?limit=500&filter=" + filter);
  fill("retained-table", page.items, (tr, r) => {
    cell(tr, r.topic); cell(tr, r.size); cell(tr, r.qos);
    cell(tr, (r.preview_encoding === "base64" ? "base64: " : "") + r.payload_preview + (r.truncated ? " …" : ""), "payload");
    cell(tr, r.expires_in === null ? "never" : r.expires_in + " s");
    button(tr, "Delete", () => api("/api/v1/retained?topic=" + encodeURIComponent(r.topic), { method: "DELETE" }));
  });
}

// -- live topic viewer -----------------------------------------------------------------------

function liveUrl() {
  const ws = overview && overview.websocket_listeners[0];
  if (!ws) return null;
  return ws.scheme + "://" + location.hostname + ":" + ws.port + ws.path;
}

function startLive(event) {
  event.preventDefault();
  stopLive();
  const url = liveUrl();
  if (!url) {
    $("live-note").textContent = "The broker has no WebSocket listener ([[listener]] protocol = \"ws\"): the live viewer needs one.";
    return;
  }
  const filter = $("live-filter").value || "#";
  const client = live = mqtt.connect(url, { clientId: "dashboard-" + Math.random().toString(16).slice(2, 10), protocolVersion: 5, reconnectPeriod: 0 });
  client.on("connect", () => {
    $("live-note").textContent = "Watching " + filter + " through " + url;
    client.subscribe(filter, { qos: 0 });
  });
  client.on("error", (e) => { $("live-note").textContent = "WebSocket: " + e.message; });
  client.on("message", (topic, payload, packet) => {
    const body = $("live-table").tBodies[0];
    const tr = document.createElement("tr");
    cell(tr, new Date().toLocaleTimeString()); cell(tr, topic); cell(tr, packet.qos);
    cell(tr, new TextDecoder().decode(payload.slice(0, 256)), "payload");
    body.insertBefore(tr, body.firstChild);
    while (body.rows.length > 200) body.deleteRow(body.rows.length - 1);
  });
  $("live-stop").disabled = false;
}

function stopLive() {
  if (live) live.end(true);
  live = null;
  $("live-stop").disabled = true;
}

// -- security: the dynamic security's clients and roles ---------------------------------------

const DYNSEC = "/api/v1/dynsec/";

function sendJson(path, body, method = "POST") {
  return api(path, { method, headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
}

function aclItem(rolename, acl) {
  const item = document.createElement("span");
  item.className = "acl";
  item.dataset.acltype = acl.acltype;
  item.dataset.topic = acl.topic;
  item.textContent = acl.acltype + " " + (acl.allow ? "allow" : "deny") + " " + acl.topic + " (" + acl.priority + ") ";
  const remove = document.createElement("button");
  remove.textContent = "✕";
  remove.title = "Remove this ACL";
  remove.className = "danger";
  remove.addEventListener("click", async () => {
    remove.disabled = true;
    try { await sendJson(DYNSEC + "roles/" + encodeURIComponent(rolename) + "/acls", { acltype: acl.acltype, topic: acl.topic }, "DELETE"); status(""); } catch (e) { status(e.message); }
    refresh();
  });
  item.appendChild(remove);
  return item;
}

async function showSecurity() {
  const [clients, roles] = await Promise.all([api(DYNSEC + "clients"), api(DYNSEC + "roles")]);
  fill("dynsec-table", clients.items, (tr, c) => {
    tr.dataset.username = c.username;
    cell(tr, c.username); cell(tr, c.clientid);
    cell(tr, c.roles.map((r) => r.rolename).join(", "));
    cell(tr, c.groups.map((g) => g.groupname).join(", "));
    cell(tr, c.disabled ? "disabled" : "enabled", "state");
    const path = DYNSEC + "clients/" + encodeURIComponent(c.username) + (c.disabled ? "/enable" : "/disable");
    button(tr, c.disabled ? "Enable" : "Disable", () => api(path, { method: "POST" }));
  });
  $("dynsec-role-names").replaceChildren(...roles.items.map((r) => new Option(r.rolename)));
  fill("dynsec-roles-table", roles.items, (tr, r) => {
    tr.dataset.rolename = r.rolename;
    cell(tr, r.rolename);
    const acls = cell(tr, "no ACLs", "acls");
    if (r.acls.length) acls.replaceChildren(...r.acls.map((a) => aclItem(r.rolename, a)));
    button(tr, "Delete", () => api(DYNSEC + "roles/" + encodeURIComponent(r.rolename), { method: "DELETE" }));
  });
}

// A form of the Security tab: its request, then the form cleared; an error stays shown (and
// the form as it was) until the next change succeeds.
function onSubmit(form, request) {
  $(form).addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await request();
      $(form).reset();
      $("dynsec-error").textContent = "";
    } catch (e) {
      $("dynsec-error").textContent = e.message;
    }
    refresh();
  });
}

onSubmit("dynsec-form", () => sendJson(DYNSEC + "clients", {
  username: $("dynsec-username").value,
  password: $("dynsec-password").value,
  roles: $("dynsec-roles").value.split(",").map((r) => r.trim()).filter((r) => r),
}));
onSubmit("dynsec-role-form", () => sendJson(DYNSEC + "roles", { rolename: $("dynsec-rolename").value }));
onSubmit("dynsec-acl-form", () => sendJson(DYNSEC + "roles/" + encodeURIComponent($("dynsec-acl-role").value) + "/acls", {
  acltype: $("dynsec-acltype").value,
  topic: $("dynsec-acl-topic").value,
  allow: $("dynsec-acl-access").value === "allow",
  priority: parseInt($("dynsec-acl-priority").value || "0", 10),
}));

// -- navigation ------------------------------------------------------------------------------

const VIEWS = { overview: showOverview, clients: showClients, sessions: showSessions, subscriptions: showSubscriptions, retained: showRetained, live: showOverview, security: showSecurity };

async function refresh() {
  try {
    await VIEWS[current]();
    if (current !== "overview" && current !== "live") await showOverview();
    status("");
  } catch (e) {
    status(e.message);
  }
}

function select() {
  const tab = location.hash.slice(1);
  current = tab in VIEWS ? tab : "overview";
  for (const section of document.querySelectorAll("section.tab")) section.hidden = section.id !== current;
  for (const link of document.querySelectorAll("#tabs a")) link.classList.toggle("active", link.dataset.tab === current);
  refresh();
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("mqttbroker-token", $("token").value);
  $("login").hidden = true;
  refresh();
});
$("live-form").addEventListener("submit", startLive);
$("live-stop").addEventListener("click", stopLive);
for (const id of ["client-search", "sub-filter", "retained-filter"]) $(id).addEventListener("input", refresh);
window.addEventListener("hashchange", select);
select();
setInterval(refresh, POLL_MS);
