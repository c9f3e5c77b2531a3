from agent_worker.cli import main

main()
