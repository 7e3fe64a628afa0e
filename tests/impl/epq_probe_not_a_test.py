import threading, time, psycopg, sys
from psycopg.rows import dict_row
dsn="postgresql://postgres@/postgres?host=/tmp/devpg&port=5499"
admin=psycopg.connect(dsn, autocommit=True)
admin.execute("DROP DATABASE IF EXISTS epq"); admin.execute("CREATE DATABASE epq")
db=dsn.replace("/postgres?","/epq?")
c=psycopg.connect(db, autocommit=True)
c.execute("""CREATE TABLE comm(id int primary key, state text);
CREATE TABLE del(cid int references comm, id int, status text, until int, primary key(cid,id));
INSERT INTO comm VALUES (1,'active'),(2,'active');
INSERT INTO del VALUES (1,1,'claimed',5),(2,1,'claimed',5);""")
mode = sys.argv[1]  # 'skip' or 'update'
SQL_SKIP = """WITH w AS (SELECT id FROM comm WHERE state='active' FOR SHARE),
 due AS (SELECT d.cid, d.id FROM del d JOIN w ON w.id=d.cid WHERE d.status='claimed' AND d.until < 10 FOR UPDATE OF d SKIP LOCKED),
 r AS (UPDATE del d SET status='pending' FROM due WHERE d.cid=due.cid AND d.id=due.id RETURNING 1)
 SELECT count(*) FROM r"""
SQL_UPD = """WITH w AS (SELECT id FROM comm WHERE state='active' FOR SHARE),
 r AS (UPDATE del d SET status='pending' FROM w WHERE d.cid=w.id AND d.status='claimed' AND d.until < 10 RETURNING 1)
 SELECT count(*) FROM r"""
sql = SQL_SKIP if mode=='skip' else SQL_UPD
t1=psycopg.connect(db); t3=psycopg.connect(db); t2=psycopg.connect(db)
t1.execute("UPDATE del SET status='pending' WHERE cid=1 AND id=1")  # sweep one, uncommitted (row of comm 1)
t3.execute("SELECT 1 FROM comm WHERE id=2 FOR UPDATE")  # a state change of comm 2
res={}
def two():
    res['n']=t2.execute(sql).fetchone()
th=threading.Thread(target=two); th.start(); time.sleep(0.5)
print("two blocked on:", c.execute("select pg_blocking_pids(%s)", (t2.info.backend_pid,)).fetchone())
t1.commit(); time.sleep(0.3); t3.commit(); th.join(5)
print("two returned", res)
try:
    c.execute("SELECT 1 FROM del WHERE cid=1 AND id=1 FOR UPDATE NOWAIT")
    print("d1 NOT locked by two")
except psycopg.errors.LockNotAvailable:
    print("d1 LOCKED by two")
t2.rollback()
