-- Why a process stopped claiming (the resource guard: "host memory 91% >= 85%"), with
-- its beat, so status, /api/v1/workers and the Workers page show it for every host,
-- not only through the local master. NULL: claiming.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS paused_reason text;
