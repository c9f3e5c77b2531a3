"""The typed contract between Python and the Lua scripts of broker/lua/.

Each script has one call builder here (pure: it returns the KEYS and ARGV lists in the layout
its `.lua` header documents) and, where it replies with more than a number, one parser; every
text format that crosses between Lua and Python (wake-ups, grants, pulls, inbox entries, queue
scores, the health hash) is defined and parsed once, in the module named for it:

    calls        ScriptCall, the status vocabulary, and what a refusal means
    submit       SubmitOptions (what producers may ask for), SubmitRequest, submit.lua
    trace        a task's W3C trace context as its record keeps it (traceparent[ tracestate])
    queue_score  the ready queue's score: priority with aging (encoded in lua/_queue.lua)
    delivery     inbox entries; dispatch.lua, accept.lua, release.lua, reclaim.lua
    reports      an agent's reports: complete.lua, renew.lua, progress.lua
    grants       grants, pulls and routing explanations; grant.lua, pulls.lua
    wake         the dispatchers' wake-up messages (sent by lua/_wake.lua)
    health       the agent health hash (kept by lua/_health.lua and reclaim.lua)
    lifecycle    cancel.lua, watch.lua, promote.lua, expire.lua, dead_letter_raw.lua
    counters     the counters the scripts keep in each capability's stats hash
    agents       register.lua, bind.lua, unbind.lua, heartbeat.lua, deregister.lua, agent_state.lua
    callbacks    HTTP agents' callbacks: callback_arm.lua, callback.lua, the token's form
"""
