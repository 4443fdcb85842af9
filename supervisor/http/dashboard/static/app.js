// The dashboard's only script: live refresh over server-sent events (paused while the
// tab is hidden), and actions sent as POST with the token in a custom header.
"use strict";
(function () {
  const TOKEN_KEY = "supervisor-token";
  const ROLE_KEY = "supervisor-role";
  const NAME_KEY = "supervisor-token-name";
  const RANK = { viewer: 0, operator: 1, admin: 2 };
  const REFRESH_GAP_MS = 2000;
  let source = null;
  let lastRefresh = 0;
  let pending = null;

  function flash(text, ok) {
    const el = document.getElementById("flash");
    el.textContent = text;
    el.className = ok ? "ok" : "error";
  }

  // What keyboard focus can land on inside the page's content, in tab order.
  const FOCUSABLE = "a[href], button, input, select, textarea, summary, [tabindex]";

  function focusables() {
    return Array.from(document.getElementById("main").querySelectorAll(FOCUSABLE));
  }

  // A table or traceback wider than its box scrolls inside itself (narrow screens): it
  // takes focus so that arrow keys can scroll it, as a mouse or a finger can.
  function markScrollers() {
    document.querySelectorAll("main table, main pre").forEach((el) => {
      if (el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1) {
        el.tabIndex = 0;
      } else {
        el.removeAttribute("tabindex");
      }
    });
  }

  function typing() {
    const f = document.activeElement;
    return f && f.closest("main") && f.matches("input:not([type=checkbox]), select, textarea");
  }

  async function refresh(force) {
    pending = null;
    lastRefresh = Date.now();
    if (!force && typing()) return; // never swap a form being typed into
    const resp = await fetch(location.href, { headers: { "X-Dashboard-Partial": "1" } });
    if (!resp.ok) return;
    const picked = new Set(Array.from(document.querySelectorAll(".pick:checked")).map((c) => c.value));
    const allBox = document.getElementById("select-all-matching");
    const allMatching = Boolean(allBox && allBox.checked);
    const opened = Array.from(document.querySelectorAll("details[id][open]")).map((d) => d.id);
    const html = await resp.text();
    // The new content replaces the old elements: keep a keyboard user's place (the same
    // element by id, else the same position in tab order) rather than dropping focus to the top.
    const was = document.activeElement;
    const inMain = was && was !== document.body && document.getElementById("main").contains(was);
    const place = inMain ? { id: was.id, index: focusables().indexOf(was) } : null;
    document.getElementById("main").innerHTML = html;
    document.querySelectorAll(".pick").forEach((c) => { c.checked = picked.has(c.value); });
    // "all matching" ticked stays ticked: a refresh between the tick and the action's
    // click dropped it, and the action said "select jobs first"
    const allAgain = document.getElementById("select-all-matching");
    if (allAgain) allAgain.checked = allMatching;
    opened.forEach((id) => { const d = document.getElementById(id); if (d) d.open = true; });
    markScrollers();
    if (place) {
      const again = (place.id && document.getElementById(place.id)) || focusables()[place.index];
      if (again) again.focus({ preventScroll: true });
    }
    applyRole();
    document.body.dataset.refreshed = String(lastRefresh);
  }

  // Actions above the token's role are hidden (data-needs: the role an action needs, from
  // the server's one table); with no token configured every action shows.
  function applyRole() {
    if (document.body.dataset.auth !== "on") return;
    const role = sessionStorage.getItem(TOKEN_KEY) ? sessionStorage.getItem(ROLE_KEY) : null;
    const rank = role in RANK ? RANK[role] : -1;
    document.querySelectorAll("[data-needs]").forEach((el) => { el.hidden = rank < RANK[el.dataset.needs]; });
    document.body.dataset.roles = "applied";
    const who = document.getElementById("who");
    if (who) who.textContent = role ? sessionStorage.getItem(NAME_KEY) + " · " + role : "no token: read only";
  }

  // Which token this is (GET /api/v1/whoami): its name and role, or null for one no one has.
  async function whoami(token) {
    const resp = await fetch("/api/v1/whoami", { headers: { "X-Supervisor-Token": token } });
    if (resp.status === 401) return null;
    if (!resp.ok) throw new Error(resp.statusText);
    return resp.json();
  }

  async function useToken(token) {
    let me;
    try { me = await whoami(token); } catch (e) { flash("could not check the token: " + e, false); return; }
    if (!me) {
      flash("unknown token: it is not one of the configured tokens", false);
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(ROLE_KEY, me.role);
    sessionStorage.setItem(NAME_KEY, me.name);
    flash("token kept for this tab: " + me.name + " (" + me.role + ")", true);
    applyRole();
  }

  async function checkStoredToken() {
    const token = sessionStorage.getItem(TOKEN_KEY);
    applyRole();
    if (!token || document.body.dataset.auth !== "on") return;
    let me;
    try { me = await whoami(token); } catch (e) { return; }  // keep what we had
    if (sessionStorage.getItem(TOKEN_KEY) !== token) return;  // changed meanwhile: the newer one stands
    if (me) {
      sessionStorage.setItem(ROLE_KEY, me.role);
      sessionStorage.setItem(NAME_KEY, me.name);
    } else {  // the config changed: this token is gone
      [TOKEN_KEY, ROLE_KEY, NAME_KEY].forEach((k) => sessionStorage.removeItem(k));
      flash("the token kept for this tab is no longer valid", false);
    }
    applyRole();
  }

  function scheduleRefresh() {
    if (pending) return;
    pending = setTimeout(refresh, Math.max(0, lastRefresh + REFRESH_GAP_MS - Date.now()));
  }

  function connect() {
    if (source || document.hidden) return;
    source = new EventSource("/events");
    source.addEventListener("change", scheduleRefresh);
    source.onopen = () => { document.getElementById("live").className = "on"; };
    source.onerror = () => { document.getElementById("live").className = "off"; };
  }

  function disconnect() {
    if (source) { source.close(); source = null; }
    document.getElementById("live").className = "paused";
  }

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) { disconnect(); } else { connect(); scheduleRefresh(); }
  });

  async function post(url, body) {
    const headers = { "Content-Type": "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers["X-Supervisor-Token"] = token;
    let resp;
    try {
      resp = await fetch(url, { method: "POST", headers, body: JSON.stringify(body || {}) });
    } catch (e) {
      flash("request failed: " + e, false);
      return;
    }
    let reply = {};
    try { reply = await resp.json(); } catch (e) { reply = {}; }
    const ok = resp.ok && reply.ok !== false;
    flash(reply.message || reply.error || resp.statusText, ok);
    await refresh(true);
  }

  function selection() {
    const box = document.querySelector(".bulk");
    if (document.getElementById("select-all-matching").checked) {
      return { all: true, filter: JSON.parse(box.dataset.filter) };
    }
    return { ids: Array.from(document.querySelectorAll(".pick:checked")).map((c) => c.value) };
  }

  document.addEventListener("click", (ev) => {
    const act = ev.target.closest("button.act");
    if (act) {
      if (act.dataset.confirm && !confirm(act.dataset.confirm)) return;
      post(act.dataset.post, act.dataset.body ? JSON.parse(act.dataset.body) : {});
      return;
    }
    const bulk = ev.target.closest("button.bulk-act");
    if (bulk) {
      const what = selection();
      if (!what.all && !what.ids.length) { flash("select jobs first", false); return; }
      post("/ui/jobs/" + bulk.dataset.action, what);
      return;
    }
    if (ev.target.id === "select-page") {
      document.querySelectorAll(".pick").forEach((c) => { c.checked = ev.target.checked; });
    }
  });

  document.addEventListener("submit", (ev) => {
    const form = ev.target;
    if (form.id === "token-form") {
      ev.preventDefault();
      const token = document.getElementById("token").value;
      document.getElementById("token").value = "";
      useToken(token);
    } else if (form.classList.contains("scale")) {
      ev.preventDefault();
      const n = parseInt(form.elements.processes.value, 10);
      flash("scaling " + form.dataset.role + " to " + n + "…", true);
      post("/ui/roles/" + encodeURIComponent(form.dataset.role) + "/scale", { processes: n });
    } else if (form.classList.contains("limit")) {
      ev.preventDefault();
      const body = {};
      for (const name of ["key", "rate", "burst", "daily_quota", "concurrency"]) {
        body[name] = form.elements[name].value.trim();
      }
      post("/ui/limits/set", body);
    }
  });

  window.addEventListener("resize", markScrollers);
  document.addEventListener("toggle", markScrollers, true); // a traceback opened may be wider than its box
  markScrollers();
  connect();
  checkStoredToken();
})();
